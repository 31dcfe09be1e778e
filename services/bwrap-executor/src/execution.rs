//! One execution from an admitted job to its `ExecResult`: the image tree it runs on (its
//! template's, built and exported on first use, or the node's), the node's run spec and
//! request files, one fresh sandbox, and the node's classification — with what the
//! host's cgroup counted (OOM kills, pids-limit hits, peak memory, CPU time) taking the place
//! of what a supervisor in a container would read from its own cgroup. A sandbox has no
//! `/sys`, and the executor trusts the kernel's counters over anything said from inside.

use std::sync::Arc;
use std::time::{Duration, Instant};

use executor_node::exchange::{request_wire, OutputStreamer};
use executor_node::job::{request_files, run_spec, FilesError};
use executor_node::outcome::{base_result, classify};
use executor_node::{BackendError, ExecutorError, Job, NodeState, TemplateImages};
use messages::exec::{ExecResult, ExecStatus, Timing, Usage};
use messages::template::TemplateRan;
use messages::{ErrorBody, ErrorKind, Subjects};

use crate::cgroup::{Counters, Limits};
use crate::config::BwrapConfig;
use crate::rootfs::{Rootfs, RootfsCache, RootfsError};
use crate::sandbox::{Finished, Launcher, SandboxError, SandboxInput};

/// The image's file tree could not be exported: the run's answer (nothing ran).
#[derive(Debug, thiserror::Error)]
#[error("no file tree of {image}: {}", kit::error_chain(.source))]
pub struct NoTree {
    image: String,
    #[source]
    source: RootfsError,
}

impl BackendError for NoTree {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Unavailable
    }
}

/// Why an accepted run never got through its sandbox: its result's error.
#[derive(Debug, thiserror::Error)]
pub enum RunFailure {
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The request and its files do not fit in the supervisor's frames.
    #[error("the request does not fit: {0}")]
    Request(#[source] std::io::Error),
    #[error("no sandbox: {}", kit::error_chain(.0))]
    Sandbox(#[source] SandboxError),
}

impl RunFailure {
    pub fn kind(&self) -> ErrorKind {
        match self {
            RunFailure::Files(e) => e.kind(),
            RunFailure::Request(_) => ErrorKind::TooLarge,
            RunFailure::Sandbox(_) => ErrorKind::Unavailable,
        }
    }
}

/// Everything an execution needs from its node. Cheap to clone.
#[derive(Clone)]
pub struct Runner {
    pub launcher: Arc<Launcher>,
    pub rootfs: Arc<RootfsCache>,
    /// The templates' images, resolved (and built when missing) as docker-executor does.
    pub images: TemplateImages,
    pub client: async_nats::Client,
    pub subjects: Subjects,
    pub config: Arc<BwrapConfig>,
}

impl Runner {
    /// The tree `job` runs on: its template's image (built first when Docker has none,
    /// exported on its first run here), or the node's; with the template that ran, for its
    /// result. An image that cannot be had is the run's answer (`unavailable`).
    pub async fn tree(
        &self,
        job: &Job,
    ) -> Result<(Arc<Rootfs>, Option<TemplateRan>), ExecutorError> {
        let (image, ran) = match &job.run.template {
            None => (self.config.node.image.clone(), None),
            Some(template) => {
                let image = self.images.image(template).await?;
                let ran = TemplateRan {
                    name: template.name.clone(),
                    image: image.clone(),
                };
                (image, Some(ran))
            }
        };
        let tree = match self.rootfs.tree(&image).await {
            Ok(tree) => tree,
            Err(source) => return Err(NoTree { image, source }.into()),
        };
        Ok((tree, ran))
    }

    /// Runs `job` in a sandbox of its own on `rootfs`; always a result.
    pub async fn execute(&self, node: &Arc<NodeState>, job: &Job, rootfs: &Rootfs) -> ExecResult {
        let started = Instant::now();
        let mut streamer = job.run.request().stream_output.then(|| {
            OutputStreamer::new(self.client.clone(), job.run.output_subject(&self.subjects))
        });
        let mut result = match self.sandboxed(node, job, rootfs, streamer.as_mut()).await {
            Ok(result) => result,
            Err(error) => {
                // A stream that never started still ends, so its readers do not hang.
                if let Some(s) = streamer.as_mut() {
                    s.finish().await;
                }
                let mut r = base_result(job);
                r.status = ExecStatus::Internal;
                r.error = Some(ErrorBody::new(error.kind(), error.to_string()));
                r
            }
        };
        result.node = Some(self.config.node_id().to_string());
        result.timing.exec_ms = Timing::ms(started.elapsed());
        result.timing.queued_ms = Timing::ms(started.duration_since(job.accepted));
        result
    }

    async fn sandboxed(
        &self,
        node: &Arc<NodeState>,
        job: &Job,
        rootfs: &Rootfs,
        streamer: Option<&mut OutputStreamer>,
    ) -> Result<ExecResult, RunFailure> {
        // No workspace travels: a sandbox is single-use and its files die with it.
        let spec = run_spec(job, &self.config.node, false);
        let files = request_files(job)?;
        let wire = request_wire(&spec, &[], &files).map_err(RunFailure::Request)?;
        let limits = Limits {
            memory_mb: job.limits.memory_mb,
            pids: job.limits.pids,
            cpus: job.limits.cpus,
        };
        // The supervisor ends the run at its timeout; this backstop covers a supervisor that
        // was killed, stalled or lied.
        let deadline = Instant::now()
            + Duration::from_millis(job.limits.timeout_ms)
            + self.config.node.kill_grace;
        // Named afresh for each sandbox, never after the execution id: the same id may run
        // twice on a node (a retry, a redelivered job), and the first sandbox's cgroup removal
        // would then kill the second sandbox in the cgroup of the same name.
        let name = messages::new_id();
        tracing::debug!(execution_id = %job.run.execution_id, sandbox = %name, "starting a sandbox");
        let input = SandboxInput {
            name: &name,
            spec: &spec,
            rootfs: &rootfs.path,
            wire,
            limits,
            deadline,
            streamer,
            filesystem: job.run.filesystem.as_ref(),
        };
        let finished = self
            .launcher
            .run(node, input)
            .await
            .map_err(RunFailure::Sandbox)?;
        Ok(outcome(job, finished))
    }
}

/// The result of a finished sandbox: the shared classification, corrected by the counters.
pub fn outcome(job: &Job, finished: Finished) -> ExecResult {
    let Finished { exchange, counters } = finished;
    let mut report = exchange.report.clone();
    if let Some(r) = report.as_mut() {
        r.oom_killed |= counters.oom_kills > 0;
        r.pids_limit_hit |= counters.pids_max_events > 0;
    }
    let mut result = classify(job, report.as_ref(), &exchange);
    if report.is_none() && counters.oom_kills > 0 {
        // The OOM killer took the supervisor itself: still an OOM, not a mystery.
        result.status = ExecStatus::Oom;
        result.error = Some(ErrorBody::new(
            ErrorKind::TooLarge,
            format!(
                "the memory limit of {} MiB was exceeded",
                job.limits.memory_mb
            ),
        ));
    }
    apply_usage(&mut result, counters);
    result
}

fn apply_usage(result: &mut ExecResult, counters: Counters) {
    let usage = result.usage.get_or_insert(Usage::default());
    if let Some(peak) = counters.peak_memory_bytes {
        usage.peak_memory_bytes = usage.peak_memory_bytes.max(peak);
    }
    if let Some(ns) = counters.cpu_ns {
        usage.cpu_ms = usage.cpu_ms.max(ns / 1_000_000);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_never_got_through_its_sandbox_says_whose_fault_it_was() {
        let io = || std::io::Error::other("no space left");
        let spawn = SandboxError::Spawn {
            program: "bwrap".into(),
            source: io(),
        };
        let files = FilesError::Content {
            path: "a.bin".into(),
            reason: "not base64".into(),
        };
        for (e, kind) in [
            (files.into(), ErrorKind::BadRequest),
            (RunFailure::Request(io()), ErrorKind::TooLarge),
            (RunFailure::Sandbox(spawn), ErrorKind::Unavailable),
        ] {
            assert_eq!(e.kind(), kind, "{e}");
        }
        let unpack = RootfsError::Unpack {
            image: "sandmesh-sandbox:x".into(),
            path: "/var/lib/x".into(),
            source: io(),
        };
        let no_tree = NoTree {
            image: "sandmesh-sandbox:x".into(),
            source: unpack,
        };
        assert_eq!(no_tree.kind(), ErrorKind::Unavailable);
        assert!(no_tree.to_string().contains("no space left"), "{no_tree}");
    }
}
