//! One execution in a given container, from request to `ExecResult`: limits applied, the
//! workspace brought up to date and the request files sent along, the one supervised exec,
//! changes pushed back, and the outcome classified (the run spec, the frames and the
//! classification are the node's, `executor_node`). Shared by every kind of run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use executor_node::changes;
use executor_node::exchange::OutputStreamer;
use executor_node::job::{request_files, run_spec, FilesError};
use executor_node::outcome::{base_result, classify, safe_paths};
use executor_node::workspace::{Held, WorkspaceError, WorkspaceSync};
use executor_node::{Job, NodeState};
use kit::AuditScope;
use messages::exec::{validate_exec, ExecRequest, ExecResult, ExecStatus, Language, Timing};
use messages::executor::{ExecutorRun, RunKind};
use messages::filesystem::FilesystemPolicy;
use messages::network::NetworkPolicy;
use messages::{ErrorBody, ErrorKind, Subjects};
use sandbox_protocol::RunSpec;

use crate::config::ExecutorConfig;
use crate::docker::{ContainerKind, ContainerLimits, DockerError, Sandboxes};
use crate::egress::{ContainerEgress, EgressHost};
use crate::exchange::{self, ExchangeInput};
use crate::lease::{ContainerLease, StartError};
use crate::proc_error::ProcError;

/// workspace-store removes workspaces unused past its TTL (hours), counting snapshots and
/// changes as use. A session that runs for hours without changing a file makes neither, so its
/// container refetches at least this often to keep the workspace alive.
const SYNC_AT_LEAST_EVERY: Duration = Duration::from_secs(3600);

/// Why a run never got to (or through) the supervisor: its result's error.
#[derive(Debug, thiserror::Error)]
pub enum RunFailure {
    #[error("no container: {0}")]
    NoContainer(#[source] StartError),
    #[error("setting the container's limits: {0}")]
    Limits(#[source] DockerError),
    #[error("clearing the container's workspace: {0}")]
    ClearWorkspace(#[source] DockerError),
    #[error(transparent)]
    Files(#[from] FilesError),
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error("the exchange with the supervisor: {0}")]
    Exchange(#[source] DockerError),
}

impl RunFailure {
    pub fn kind(&self) -> ErrorKind {
        match self {
            RunFailure::NoContainer(_) => ErrorKind::Unavailable,
            RunFailure::Limits(_) | RunFailure::ClearWorkspace(_) | RunFailure::Exchange(_) => {
                ErrorKind::Internal
            }
            RunFailure::Files(e) => e.kind(),
            RunFailure::Workspace(e) => e.kind(),
        }
    }
}

/// Everything an execution needs from its node. Cheap to clone.
#[derive(Clone)]
pub struct Runner {
    pub sandboxes: Sandboxes,
    pub workspace: Option<WorkspaceSync>,
    pub client: async_nats::Client,
    pub subjects: Subjects,
    pub config: Arc<ExecutorConfig>,
    /// Binds the egress proxies of containers made for a network policy.
    pub egress: EgressHost,
    /// Where the session's background processes say they ended.
    pub auditor: kit::Auditor,
}

/// Whether the container can take another execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Reusable,
    /// Killed, or in an unknown state: remove it.
    Broken,
    /// It could not start anything (stopped or gone, e.g. killed from outside while warm):
    /// the run never began, so it may be retried once in another container.
    Unusable,
}

impl Runner {
    /// The same runner with its containers made from `image` (a template's).
    pub fn with_image(&self, image: &str) -> Self {
        Self {
            sandboxes: self.sandboxes.with_image(image),
            ..self.clone()
        }
    }

    /// Starts a container of `kind`, with an egress proxy of its own when `network` is set
    /// (never for the warm pool: a warm container has no network).
    pub async fn start_container(
        &self,
        node: &Arc<NodeState>,
        kind: ContainerKind,
        session: Option<&str>,
        limits: ContainerLimits,
        network: Option<&NetworkPolicy>,
        filesystem: Option<&FilesystemPolicy>,
    ) -> Result<ContainerLease, StartError> {
        let egress = network.map(|p| self.egress.bind(p)).transpose()?;
        let sandboxes = &self.sandboxes;
        let lease =
            ContainerLease::start(sandboxes, node, kind, session, limits, egress, filesystem);
        Ok(lease.await?)
    }

    fn spec(&self, job: &Job, container: &ContainerLease) -> RunSpec {
        // Changed files travel back only when there is a workspace to put them in.
        let keeps_changes = self.workspace.is_some() && job.run.session_id().is_some();
        let mut spec = run_spec(job, &self.config.node, keeps_changes);
        spec.egress_socket = container
            .egress
            .as_ref()
            .map(|_| ContainerEgress::socket_in_container());
        spec
    }

    /// What the container's workspace needs before the run (an archive to unpack, maybe
    /// empty), and the revision it will then hold. A container already holding the current
    /// revision costs one KV read and no workspace-store request; one holding anything else is
    /// cleared and gets the whole snapshot.
    async fn workspace_in(
        &self,
        container: &mut ContainerLease,
        job: &Job,
    ) -> Result<(Vec<u8>, Held), (RunFailure, Health)> {
        let (Some(ws), Some(session)) = (&self.workspace, job.run.session_id()) else {
            return Ok((Vec::new(), container.held));
        };
        if matches!(container.held, Held::At(_) | Held::Absent) {
            match ws.revision(session).await {
                Ok(current) if container.held.matches(current) => {
                    if container.synced.elapsed() >= SYNC_AT_LEAST_EVERY {
                        // Fetched only to count as use: the container keeps what it holds,
                        // with whatever the session's processes wrote since the last run.
                        ws.snapshot(session)
                            .await
                            .map_err(|e| (e.into(), Health::Reusable))?;
                        container.synced = Instant::now();
                    }
                    return Ok((Vec::new(), container.held));
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(session, error = %e, "refetching the workspace"),
            }
        }
        if container.held != Held::Nothing {
            // The snapshot only adds files: what was deleted since must go first.
            self.sandboxes
                .clear_workspace(&container.name)
                .await
                .map_err(|e| (RunFailure::ClearWorkspace(e), Health::Unusable))?;
            container.held = Held::Nothing;
        }
        let snapshot = ws
            .snapshot(session)
            .await
            .map_err(|e| (e.into(), Health::Reusable))?;
        container.synced = Instant::now();
        Ok((snapshot.tar, snapshot.holds))
    }

    /// A run of nothing in `session`'s container, for its one effect: the push of what
    /// changed in the workspace since the session's last run (what its processes wrote).
    pub fn sync_job(&self, session: &str) -> Result<Job, ProcError> {
        let request = ExecRequest {
            language: Language::Shell,
            code: "true".into(),
            session_id: Some(session.to_string()),
            requested_by: Some("workspace sync".into()),
            ..Default::default()
        };
        let kind = RunKind::Session {
            session_id: session.to_string(),
        };
        let run =
            ExecutorRun::new(messages::new_id(), request, kind).map_err(ProcError::SyncRun)?;
        let limits = validate_exec(run.request(), &self.config.node.ceilings)?;
        Ok(Job {
            run,
            limits,
            accepted: Instant::now(),
            retried: false,
        })
    }

    /// Runs `job` in `container` and says whether the container is still usable.
    pub async fn execute(&self, container: &mut ContainerLease, job: &Job) -> (ExecResult, Health) {
        let started = Instant::now();
        let mut streamer = job.run.request().stream_output.then(|| {
            OutputStreamer::new(self.client.clone(), job.run.output_subject(&self.subjects))
        });
        if let Some(egress) = &container.egress {
            let request = job.run.request();
            egress.begin(AuditScope {
                execution_id: Some(job.run.execution_id.clone()),
                session_id: request.session_id.clone(),
                trace_id: None,
                actor: request.requested_by.clone(),
                // The tenant the scheduler names for the run; the executor has no caller.
                tenant: job.run.tenant.clone(),
                ..Default::default()
            });
        }
        let outcome = self
            .prepare_and_exchange(container, job, streamer.as_mut())
            .await;
        let (mut result, health) = match outcome {
            Ok(done) => done,
            Err((error, health)) => {
                // A stream that never started still ends, so its readers do not hang.
                if let Some(s) = streamer.as_mut() {
                    s.finish().await;
                }
                (
                    self.failed(job, ExecStatus::Internal, &error, started),
                    health,
                )
            }
        };
        result.network = container.egress.as_ref().map(|e| e.finish());
        result.timing.exec_ms = Timing::ms(started.elapsed());
        // Time spent waiting for a container or for the session's earlier runs.
        result.timing.queued_ms = Timing::ms(started.duration_since(job.accepted));
        (result, health)
    }

    async fn prepare_and_exchange(
        &self,
        container: &mut ContainerLease,
        job: &Job,
        streamer: Option<&mut OutputStreamer>,
    ) -> Result<(ExecResult, Health), (RunFailure, Health)> {
        let wanted = ContainerLimits::from(&job.limits);
        if container.limits != wanted {
            self.sandboxes
                .update_limits(&container.name, wanted)
                .await
                .map_err(|e| (RunFailure::Limits(e), Health::Unusable))?;
            container.limits = wanted;
        }
        let files = request_files(job).map_err(|e| (e.into(), Health::Reusable))?;
        let (archive, will_hold) = self.workspace_in(container, job).await?;
        // Until the supervisor says it unpacked, the container holds nothing known.
        if !archive.is_empty() {
            container.held = Held::Unknown;
        }
        let spec = self.spec(job, container);
        // The supervisor ends the run at its timeout; this backstop covers a supervisor that
        // was killed, stalled or lied.
        let deadline = Instant::now()
            + Duration::from_millis(job.limits.timeout_ms)
            + self.config.node.kill_grace;
        let input = ExchangeInput {
            container: &container.name,
            spec: &spec,
            archive: &archive,
            files: &files,
            deadline,
            streamer,
        };
        let ex = exchange::exchange(&self.sandboxes, &mut container.resident, input)
            .await
            .map_err(|e| (RunFailure::Exchange(e), Health::Unusable))?;
        let health = if ex.ending.container_suspect() {
            Health::Broken
        } else {
            Health::Reusable
        };
        let mut result = classify(job, ex.report.as_ref(), &ex);
        result.node = Some(self.sandboxes.spec.node_id.clone());
        if ex.report.is_some() {
            container.held = will_hold;
        }
        if let (Some(ws), Some(session), Some(report)) =
            (&self.workspace, job.run.session_id(), &ex.report)
        {
            // Files not saved (refused names, changes past what a run carries) stay in the
            // container only: the next run there starts from the store's copy instead.
            if !result.files_refused.is_empty() || result.files_omitted > 0 {
                container.held = Held::Unknown;
            }
            let changes = changes::screen_archive(ex.changes);
            let deleted = safe_paths(&report.files_deleted);
            if !changes.is_empty() || !deleted.is_empty() {
                match ws.push(session, changes, deleted).await {
                    // The container holds the pushed revision only if nothing else changed
                    // the workspace since the revision it held before.
                    Ok(pushed) => {
                        container.synced = Instant::now();
                        container.held = match pushed.revision {
                            Some(made) if container.held.matches(pushed.previous_revision) => {
                                Held::At(made)
                            }
                            _ => Held::Unknown,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(session, error = %e, "could not push workspace changes");
                        container.held = Held::Unknown;
                        result.error.get_or_insert(ErrorBody::new(
                            e.kind(),
                            format!("the run finished but its file changes were not saved: {e}"),
                        ));
                    }
                }
            }
        }
        Ok((result, health))
    }

    /// A result for a run that never got to (or through) the supervisor.
    pub fn failed(
        &self,
        job: &Job,
        status: ExecStatus,
        error: &RunFailure,
        started: Instant,
    ) -> ExecResult {
        let mut r = base_result(job);
        r.status = status;
        r.error = Some(ErrorBody::new(error.kind(), error.to_string()));
        r.node = Some(self.sandboxes.spec.node_id.clone());
        r.timing.exec_ms = Timing::ms(started.elapsed());
        r
    }
}

#[cfg(test)]
mod tests {
    use sandmesh_client::ClientError;

    use super::*;

    #[test]
    fn a_run_that_never_reached_its_supervisor_says_whose_fault_it_was() {
        let docker = || DockerError::Failed {
            op: "exec",
            target: "c1".into(),
            message: "no such container".into(),
        };
        let refused = ClientError::Service {
            subject: "sandbox.v1.workspace.snapshot".into(),
            body: ErrorBody::not_found("no such session"),
        };
        let files = FilesError::Content {
            path: "a.bin".into(),
            reason: "not base64".into(),
        };
        for (e, kind) in [
            (
                RunFailure::NoContainer(docker().into()),
                ErrorKind::Unavailable,
            ),
            (RunFailure::Limits(docker()), ErrorKind::Internal),
            (RunFailure::ClearWorkspace(docker()), ErrorKind::Internal),
            (RunFailure::Exchange(docker()), ErrorKind::Internal),
            (files.into(), ErrorKind::BadRequest),
            (
                WorkspaceError::Snapshot(refused).into(),
                ErrorKind::Unavailable,
            ),
        ] {
            assert_eq!(e.kind(), kind, "{e}");
        }
    }
}
