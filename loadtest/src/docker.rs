//! The Docker side of the loadtest: the baseline container (the sandbox image, hardened like
//! the executor's containers, kept running so each measured exec is a bare `docker exec`), the
//! bare sandboxes of a burst (the same image and hardening, one container per program, started
//! and removed), and the count of sandbox containers left behind.

use std::collections::HashMap;

use anyhow::Context;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, ContainerSummary};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, StartContainerOptions,
};
use bollard::Docker;
use containers::{
    hardened_host_config, tmpfs_options, Hardening, LABEL_KIND, LABEL_MESH, LABEL_SANDMESH,
    SANDBOX_UID,
};
use futures::StreamExt;
use std::time::Instant;

use crate::report::ContainerCount;

/// The kind of the loadtest's own containers (the baseline container, the bare sandboxes of a
/// burst): never counted as a leak of the mesh, always removed.
pub const KIND_BASELINE: &str = "loadtest-baseline";

pub async fn connect() -> anyhow::Result<Docker> {
    let docker = Docker::connect_with_local_defaults().context("cannot reach the Docker daemon")?;
    docker
        .negotiate_version()
        .await
        .context("cannot reach the Docker daemon")
}

/// `Docker <version> (API <api>)`, for the report.
pub async fn version(docker: &Docker) -> String {
    match docker.version().await {
        Ok(v) => format!(
            "{} (API {})",
            v.version.unwrap_or_default(),
            v.api_version.unwrap_or_default()
        ),
        Err(e) => format!("unknown ({e})"),
    }
}

/// The body of the baseline container: [`hardened_body`] with `sleep` as its main process.
pub fn baseline_body(image: &str) -> ContainerCreateBody {
    hardened_body(image, &["sleep", "infinity"])
}

/// A container of `image` running `cmd` under the executor's hardening (no capabilities, no new
/// privileges, default seccomp, read-only root, tmpfs /tmp and /workspace, pids / memory / CPU
/// limits, ulimits, no network, non-root, no logs), labelled as the loadtest's own.
fn hardened_body(image: &str, cmd: &[&str]) -> ContainerCreateBody {
    let host = hardened_host_config(&Hardening {
        memory_mb: 256,
        cpus: 1.0,
        pids: 128,
        nofile: 256,
        fsize_bytes: 64 << 20,
        tmpfs: HashMap::from([
            ("/tmp".to_string(), tmpfs_options(64, SANDBOX_UID, "1777")),
            (
                "/workspace".to_string(),
                tmpfs_options(64, SANDBOX_UID, "0755"),
            ),
        ]),
    });
    ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(cmd.iter().map(|a| a.to_string()).collect()),
        user: Some(format!("{SANDBOX_UID}:{SANDBOX_UID}")),
        working_dir: Some("/workspace".into()),
        network_disabled: Some(true),
        labels: Some(HashMap::from([
            (LABEL_SANDMESH.to_string(), "1".to_string()),
            (LABEL_KIND.to_string(), KIND_BASELINE.to_string()),
        ])),
        host_config: Some(host),
        ..Default::default()
    }
}

/// A running baseline container, removed by [`BaselineContainer::remove`].
pub struct BaselineContainer {
    pub docker: Docker,
    pub name: String,
}

impl BaselineContainer {
    pub async fn start(docker: &Docker, image: &str) -> anyhow::Result<Self> {
        let name = format!(
            "sandmesh-loadtest-baseline-{}",
            messages::new_id().to_ascii_lowercase()
        );
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        docker
            .create_container(Some(options), baseline_body(image))
            .await
            .with_context(|| format!("creating the baseline container from {image}"))?;
        let me = Self {
            docker: docker.clone(),
            name,
        };
        if let Err(e) = docker
            .start_container(&me.name, None::<StartContainerOptions>)
            .await
        {
            me.remove().await;
            return Err(e).context("starting the baseline container");
        }
        Ok(me)
    }

    /// One bare exec: create, start attached, read all output, inspect the exit code.
    /// Returns the exit code and stdout.
    pub async fn exec(&self, cmd: &[&str]) -> anyhow::Result<(i64, String)> {
        let options = CreateExecOptions {
            cmd: Some(cmd.to_vec()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let exec = self.docker.create_exec(&self.name, options).await?;
        let mut stdout = String::new();
        if let StartExecResults::Attached { mut output, .. } =
            self.docker.start_exec(&exec.id, None).await?
        {
            while let Some(item) = output.next().await {
                if let LogOutput::StdOut { message } = item? {
                    stdout.push_str(&String::from_utf8_lossy(&message));
                }
            }
        }
        let code = self
            .docker
            .inspect_exec(&exec.id)
            .await?
            .exit_code
            .unwrap_or(-1);
        Ok((code, stdout))
    }

    pub async fn remove(&self) {
        containers::remove(&self.docker, &self.name).await;
    }
}

/// One bare sandbox: a hardened container of `image` running `argv`, created, attached and
/// started; returns when its first line of stdout arrived, and that line. The container is
/// removed before this returns, whatever happened, and the whole is bounded by `bound`.
pub async fn bare_sandbox_first_line(
    docker: &Docker,
    image: &str,
    argv: &[&str],
    bound: std::time::Duration,
) -> anyhow::Result<(Instant, String)> {
    let name = format!(
        "sandmesh-loadtest-floor-{}",
        messages::new_id().to_ascii_lowercase()
    );
    let run = async {
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        docker
            .create_container(Some(options), hardened_body(image, argv))
            .await
            .with_context(|| format!("creating a bare sandbox from {image}"))?;
        // Attached before it starts, so no output can pass unseen (its log driver is `none`).
        let attach = AttachContainerOptionsBuilder::new()
            .stdout(true)
            .stderr(true)
            .stream(true)
            .build();
        let mut output = docker
            .attach_container(&name, Some(attach))
            .await
            .context("attaching to a bare sandbox")?
            .output;
        docker
            .start_container(&name, None::<StartContainerOptions>)
            .await
            .context("starting a bare sandbox")?;
        let mut stdout = String::new();
        while let Some(item) = output.next().await {
            match item? {
                LogOutput::StdOut { message } => {
                    stdout.push_str(&String::from_utf8_lossy(&message));
                    if stdout.contains('\n') {
                        return Ok((Instant::now(), stdout));
                    }
                }
                LogOutput::StdErr { message } => {
                    anyhow::bail!("stderr: {}", String::from_utf8_lossy(&message))
                }
                _ => {}
            }
        }
        anyhow::bail!("the bare sandbox exited without a line of output ({stdout:?})")
    };
    let outcome = tokio::time::timeout(bound, run).await;
    containers::remove(docker, &name).await;
    outcome.with_context(|| format!("no first line from a bare sandbox within {bound:?}"))?
}

/// Every container of the mesh `mesh_id` (or, without one, every one carrying the `sandmesh`
/// label), running or not.
pub async fn sandbox_containers(
    docker: &Docker,
    mesh_id: Option<&str>,
) -> anyhow::Result<Vec<ContainerSummary>> {
    let label = match mesh_id {
        Some(id) => format!("{LABEL_MESH}={id}"),
        None => LABEL_SANDMESH.to_string(),
    };
    Ok(containers::list(docker, &label).await?)
}

/// Counts containers by kind. Leaked: every session or other container (the run closes its
/// sessions), and running warm ones beyond the pool size.
pub fn count_containers(list: &[ContainerSummary], warm_pool: u64) -> ContainerCount {
    let mut c = ContainerCount::default();
    for s in list {
        let kind = s
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_KIND))
            .map(String::as_str);
        if kind == Some(KIND_BASELINE) {
            continue;
        }
        c.total += 1;
        let running = s.state.as_ref().map(|st| st.to_string()) == Some("running".into());
        // A warm container that stopped is no longer part of the pool: it counts as other.
        match kind {
            Some("warm") if running => c.warm += 1,
            Some("session") => c.session += 1,
            _ => c.other += 1,
        }
    }
    c.leaked = c.session + c.other + c.warm.saturating_sub(warm_pool);
    c
}

#[cfg(test)]
mod tests {
    use bollard::models::ContainerSummaryStateEnum;

    use super::*;

    fn summary(kind: &str, state: ContainerSummaryStateEnum) -> ContainerSummary {
        ContainerSummary {
            labels: Some(HashMap::from([
                (LABEL_SANDMESH.to_string(), "1".to_string()),
                (LABEL_KIND.to_string(), kind.to_string()),
            ])),
            state: Some(state),
            ..Default::default()
        }
    }

    #[test]
    fn the_warm_pool_is_not_a_leak_but_everything_else_is() {
        use ContainerSummaryStateEnum::{EXITED, RUNNING};
        let list = vec![
            summary("warm", RUNNING),
            summary("warm", RUNNING),
            summary("warm", RUNNING),
            summary("session", RUNNING),
            summary("warm", EXITED),
            summary(KIND_BASELINE, RUNNING),
        ];
        let c = count_containers(&list, 2);
        assert_eq!((c.total, c.warm, c.session, c.other), (5, 3, 1, 1));
        // One warm beyond the pool, the session, and the exited warm one.
        assert_eq!(c.leaked, 3);
        assert_eq!(count_containers(&list[..2], 2).leaked, 0);
    }

    #[test]
    fn the_baseline_container_is_hardened_like_a_sandbox() {
        let body = baseline_body("sandmesh/sandbox:latest");
        let host = body.host_config.unwrap();
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(body.user.as_deref(), Some("10001:10001"));
        assert!(host
            .security_opt
            .unwrap()
            .iter()
            .any(|o| o.starts_with("no-new-privileges")));
    }
}
