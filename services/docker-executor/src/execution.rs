//! One execution in a given container, from request to `ExecResult`: limits applied, the
//! workspace brought up to date and the request files sent along, the one supervised exec,
//! changes pushed back, and the outcome classified. Shared by every kind of run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kit::AuditScope;
use messages::exec::{ExecResult, ExecStatus, Language, Timing};
use messages::executor::{ExecutorRun, RunKind};
use messages::network::NetworkPolicy;
use messages::template::TemplateRan;
use messages::validate::EffectiveLimits;
use messages::{ErrorBody, Subjects};
use ractor::RpcReplyPort;
use sandbox_protocol::{KernelLanguage, RunSpec, PROTOCOL_VERSION};

use crate::config::ExecutorConfig;
use crate::docker::{ContainerKind, ContainerLimits, Sandboxes, WORKSPACE_DIR};
use crate::egress::{ContainerEgress, EgressHost};
use crate::exchange::{self, ExchangeInput, OutputStreamer};
use crate::lease::{ContainerLease, Held, RunSlot, StartError};
use crate::node::NodeState;
use crate::outcome::{base_result, classify, safe_paths};
use crate::workspace::WorkspaceSync;

/// Where the code file goes: outside the workspace, so it is never a "changed file".
const CODE_DIR: &str = "/tmp/.sandmesh";

/// workspace-store removes workspaces unused past its TTL (hours), counting snapshots and
/// changes as use. A session that runs for hours without changing a file makes neither, so its
/// container refetches at least this often to keep the workspace alive.
const SYNC_AT_LEAST_EVERY: Duration = Duration::from_secs(3600);

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
}

/// An accepted run with its limits decided.
#[derive(Debug)]
pub struct Job {
    pub run: ExecutorRun,
    pub limits: EffectiveLimits,
    pub accepted: Instant,
    /// Already retried once after an unusable container.
    pub retried: bool,
}

impl Job {
    /// The session whose workspace travels with this run: none for an isolated run, which
    /// makes no workspace round trip at all.
    pub fn workspace_session(&self) -> Option<&str> {
        match self.run.kind {
            RunKind::Isolated => None,
            RunKind::Pooled | RunKind::Session => self.run.request.session_id.as_deref(),
        }
    }
}

pub type Reply = RpcReplyPort<Result<ExecResult, ErrorBody>>;

/// A job with the caller waiting for it and its run slot: answering consumes it (and gives
/// the slot back); dropping it unanswered does too, and the caller learns the actor is gone.
pub struct Admitted {
    pub job: Job,
    reply: Reply,
    slot: RunSlot,
    /// The template and image it runs in, once resolved; its result says so.
    pub ran: Option<TemplateRan>,
}

impl Admitted {
    pub fn new(job: Job, reply: Reply, slot: RunSlot) -> Self {
        Self {
            job,
            reply,
            slot,
            ran: None,
        }
    }

    pub fn answer(self, mut result: Result<ExecResult, ErrorBody>) {
        if let Ok(r) = &mut result {
            r.template = self.ran;
        }
        let _ = self.reply.send(result);
        self.slot.finished();
    }
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

fn program(language: Language) -> (Vec<String>, String) {
    let (file, argv): (&str, &[&str]) = match language {
        Language::Python => ("main.py", &["python3", "-u"]),
        Language::Javascript => ("main.js", &["node"]),
        Language::Shell => ("main.sh", &["bash"]),
    };
    let path = format!("{CODE_DIR}/{file}");
    let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    argv.push(path.clone());
    (argv, path)
}

/// The most output a result can carry over `client`: the server's max payload less room for
/// the rest of the result.
pub fn output_budget(client: &async_nats::Client) -> u64 {
    let max_payload = client.server_info().max_payload as u64;
    max_payload.saturating_sub(64 * 1024).max(64 * 1024)
}

/// The supervisor's request for `job`, the same for every backend: the program for its
/// language, a clean environment (the request's variables on top), the node's limits, and
/// room for changed files only when `keeps_changes` (a workspace takes them).
pub fn run_spec(job: &Job, config: &ExecutorConfig, keeps_changes: bool) -> RunSpec {
    let req = &job.run.request;
    let (argv, code_path) = program(req.language);
    let mut env: Vec<(String, String)> = [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", WORKSPACE_DIR),
        ("LANG", "C.UTF-8"),
        ("TMPDIR", "/tmp"),
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        // The script lives in /tmp/.sandmesh; modules are imported from the workspace.
        ("PYTHONPATH", WORKSPACE_DIR),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in &req.env {
        env.retain(|(name, _)| name != k);
        env.push((k.clone(), v.clone()));
    }
    RunSpec {
        version: PROTOCOL_VERSION,
        argv,
        code_path,
        code: req.code.clone(),
        stdin: req.stdin.clone(),
        env,
        workspace: WORKSPACE_DIR.into(),
        timeout_ms: job.limits.timeout_ms,
        max_output_bytes: job.limits.max_output_bytes,
        nofile: config.nofile,
        fsize_bytes: config.fsize_mb << 20,
        max_changes_bytes: if keeps_changes {
            config.workspace_mb << 20
        } else {
            0
        },
        // Set by the backend whose container has an egress socket.
        egress_socket: None,
        kernel: match (req.kernel, req.language) {
            (false, _) => None,
            (true, Language::Python) => Some(KernelLanguage::Python),
            (true, Language::Javascript) => Some(KernelLanguage::Javascript),
            // Refused on admission: a shell has no kernel.
            (true, Language::Shell) => None,
        },
    }
}

/// The request's files as a tar (paths were validated on admission).
pub fn request_files(job: &Job) -> Result<Vec<u8>, ErrorBody> {
    let files = &job.run.request.files;
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let mut b = tar::Builder::new(Vec::new());
    for f in files {
        let bytes = f.bytes().map_err(ErrorBody::bad_request)?;
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, &f.path, bytes.as_slice())
            .map_err(|e| ErrorBody::bad_request(format!("{}: {e}", f.path)))?;
    }
    b.into_inner()
        .map_err(|e| ErrorBody::internal(e.to_string()))
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
    ) -> Result<ContainerLease, StartError> {
        let egress = network.map(|p| self.egress.bind(p)).transpose()?;
        Ok(ContainerLease::start(&self.sandboxes, node, kind, session, limits, egress).await?)
    }

    /// The most output a result can carry: the server's max payload less room for the rest
    /// of the result.
    pub fn output_budget(&self) -> u64 {
        output_budget(&self.client)
    }

    fn spec(&self, job: &Job, container: &ContainerLease) -> RunSpec {
        // Changed files travel back only when there is a workspace to put them in.
        let keeps_changes = self.workspace.is_some() && job.workspace_session().is_some();
        let mut spec = run_spec(job, &self.config, keeps_changes);
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
    ) -> Result<(Vec<u8>, Held), (ErrorBody, Health)> {
        let (Some(ws), Some(session)) = (&self.workspace, job.workspace_session()) else {
            return Ok((Vec::new(), container.held));
        };
        let recent = container.synced.elapsed() < SYNC_AT_LEAST_EVERY;
        if recent && matches!(container.held, Held::At(_) | Held::Absent) {
            match ws.revision(session).await {
                Ok(current) if container.held.matches(current) => {
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
                .map_err(|e| (ErrorBody::internal(e.to_string()), Health::Unusable))?;
            container.held = Held::Nothing;
        }
        let snapshot = ws
            .snapshot(session)
            .await
            .map_err(|e| (e, Health::Reusable))?;
        container.synced = Instant::now();
        Ok((snapshot.tar, snapshot.holds))
    }

    /// Runs `job` in `container` and says whether the container is still usable.
    pub async fn execute(&self, container: &mut ContainerLease, job: &Job) -> (ExecResult, Health) {
        let started = Instant::now();
        let mut streamer = job.run.request.stream_output.then(|| {
            OutputStreamer::new(self.client.clone(), job.run.output_subject(&self.subjects))
        });
        if let Some(egress) = &container.egress {
            let request = &job.run.request;
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
                    self.failed(job, ExecStatus::Internal, error, started),
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
    ) -> Result<(ExecResult, Health), (ErrorBody, Health)> {
        let wanted = ContainerLimits::from(&job.limits);
        if container.limits != wanted {
            self.sandboxes
                .update_limits(&container.name, wanted)
                .await
                .map_err(|e| (ErrorBody::internal(e.to_string()), Health::Unusable))?;
            container.limits = wanted;
        }
        let files = request_files(job).map_err(|e| (e, Health::Reusable))?;
        let (archive, will_hold) = self.workspace_in(container, job).await?;
        // Until the supervisor says it unpacked, the container holds nothing known.
        if !archive.is_empty() {
            container.held = Held::Unknown;
        }
        let spec = self.spec(job, container);
        // The supervisor ends the run at its timeout; this backstop covers a supervisor that
        // was killed, stalled or lied.
        let deadline =
            Instant::now() + Duration::from_millis(job.limits.timeout_ms) + self.config.kill_grace;
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
            .map_err(|e| (ErrorBody::internal(e.to_string()), Health::Unusable))?;
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
        if job.run.kind == RunKind::Isolated {
            // Its files die with its container: none was created anywhere that lasts.
            result.files_created.clear();
            result.files_modified.clear();
        }
        if let (Some(ws), Some(session), Some(report)) =
            (&self.workspace, job.workspace_session(), &ex.report)
        {
            let deleted = safe_paths(&report.files_deleted);
            if !ex.changes.is_empty() || !deleted.is_empty() {
                match ws.push(session, ex.changes, deleted).await {
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
                            e.kind,
                            format!(
                                "the run finished but its file changes were not saved: {}",
                                e.message
                            ),
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
        error: ErrorBody,
        started: Instant,
    ) -> ExecResult {
        let mut r = base_result(job);
        r.status = status;
        r.error = Some(error);
        r.node = Some(self.sandboxes.spec.node_id.clone());
        r.timing.exec_ms = Timing::ms(started.elapsed());
        r
    }
}
