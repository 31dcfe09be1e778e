//! Plain Docker-API execs and timing helpers, outside the executor's path: the baseline the
//! benchmarks compare against (a bare exec of the same command in an already running
//! container) and the tests' window into a container. Reusable by `loadtest`.

use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures::StreamExt;

use containers::DockerError;

/// What a bare exec printed and how it ended.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    pub exit_code: Option<i64>,
    pub stdout: String,
    pub stderr: String,
}

/// `docker exec <container> <cmd...>`: create, start attached, read to the end, inspect the
/// exit code — what any client needs for one command with its result.
pub async fn exec_capture(
    docker: &Docker,
    container: &str,
    cmd: &[&str],
) -> Result<Captured, DockerError> {
    let options = CreateExecOptions {
        cmd: Some(cmd.to_vec()),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        ..Default::default()
    };
    let exec = docker
        .create_exec(container, options)
        .await
        .map_err(|e| DockerError::api("exec", container, e))?;
    let mut out = Captured::default();
    if let StartExecResults::Attached { mut output, .. } =
        docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| DockerError::api("exec start", container, e))?
    {
        while let Some(item) = output.next().await {
            match item {
                Ok(LogOutput::StdOut { message }) => {
                    out.stdout.push_str(&String::from_utf8_lossy(&message))
                }
                Ok(LogOutput::StdErr { message }) => {
                    out.stderr.push_str(&String::from_utf8_lossy(&message))
                }
                Ok(_) => {}
                Err(e) => return Err(DockerError::api("exec read", container, e)),
            }
        }
    }
    out.exit_code = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| DockerError::api("exec inspect", container, e))?
        .exit_code;
    Ok(out)
}

/// The PIDs and command lines of every process in the container except the probe itself.
pub async fn processes(
    docker: &Docker,
    container: &str,
) -> Result<Vec<(u32, String)>, DockerError> {
    let script = r#"for p in /proc/[0-9]*; do
        pid=${p#/proc/}; [ "$pid" = "$$" ] && continue
        cmd=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null) || continue
        [ -n "$cmd" ] && echo "$pid $cmd"
    done; true"#;
    let out = exec_capture(docker, container, &["bash", "-c", script]).await?;
    Ok(out
        .stdout
        .lines()
        .filter_map(|l| {
            let (pid, cmd) = l.split_once(' ')?;
            Some((pid.parse().ok()?, cmd.trim().to_string()))
        })
        // The probe's own subshells (`$(tr ...)`) show up as copies of the probe.
        .filter(|(_, cmd)| !cmd.starts_with("bash -c for p in"))
        .collect())
}

/// Percentile (0–100) of sorted samples, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&s, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&s, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }
}
