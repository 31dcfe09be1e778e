//! `Dispatcher`: the place and run stages of the [`crate::pipeline::Pipeline`]. Work of a
//! session goes to the node holding its container ([`SessionAffinity`]); other work to the node
//! the strategy picks ([`Placer`], waiting for a free slot), or to the `executor.docker.run`
//! queue group while no node is known. Strict isolation without a session is its own run kind
//! (`RunKind::Isolated`): a fresh single-use container, no workspace, no fake session. Light
//! work (tier `ephemeral`, no session, no network policy, assessed SAFE; in any template) goes
//! first to a node offering the bubblewrap backend ([`light_backend`]), per
//! `SANDMESH_EPHEMERAL_BACKEND`.

use std::time::Duration;

use messages::exec::{ExecResult, ExecStatus, Tier};
use messages::executor::{Backend, ExecutorRun, RunKind};
use messages::session::SessionRecord;
use messages::ErrorBody;

use crate::affinity::SessionAffinity;
use crate::aio::AioRunner;
use crate::error::{SchedulerError, StoreError};
use crate::execution::Execution;
use crate::executor_runner::{settle, Call, ExecutorRunner};
use crate::placement::Requirements;
use crate::placer::{Placement, Placer, PLACEMENT_ATTEMPTS};
use crate::tier::{light_backend, EphemeralBackend};

#[derive(Clone)]
pub struct Dispatcher {
    placer: Placer,
    executor: ExecutorRunner,
    affinity: SessionAffinity,
    /// Tier `aio` runs in the session's AIO instance instead of on an executor.
    aio: AioRunner,
    /// Added to an execution's own timeout; past it the executor counts as lost.
    exec_grace: Duration,
    /// Added besides for a run whose template image may be built first.
    template_build_grace: Duration,
    ephemeral_backend: EphemeralBackend,
}

impl Dispatcher {
    pub fn new(
        placer: Placer,
        executor: ExecutorRunner,
        affinity: SessionAffinity,
        aio: AioRunner,
        exec_grace: Duration,
        template_build_grace: Duration,
        ephemeral_backend: EphemeralBackend,
    ) -> Self {
        Self {
            placer,
            executor,
            affinity,
            aio,
            exec_grace,
            template_build_grace,
            ephemeral_backend,
        }
    }

    /// The session's record (`None`: not opened yet; its first execution opens it).
    pub async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.affinity.sessions().get(session_id).await
    }

    /// Why tier `aio` cannot run `exec` as asked, if it cannot: an AIO instance is the
    /// aio-pool's container, not an executor's, so no filesystem policy is mounted there and it
    /// has no egress at all — work under either policy (its own, its template's or its
    /// session's; the record read again when the execution was parked and so holds none) is
    /// refused rather than run without it.
    async fn aio_refusal(&self, exec: &Execution) -> Result<Option<ErrorBody>, StoreError> {
        let record = match (&exec.session, &exec.request.session_id) {
            (Some(record), _) => Some(record.clone()),
            (None, Some(id)) => self.session(id).await?,
            (None, None) => None,
        };
        let session = record.as_ref();
        let refusal = |policy: &str, field: &str| {
            ErrorBody::bad_request(format!(
                "tier aio cannot apply a {policy} (the request's, its template's or its \
                 session's): run it in tier session"
            ))
            .with_details(serde_json::json!({ "field": field, "tier": "aio" }))
        };
        if exec.filesystem.is_some() || session.is_some_and(|r| r.filesystem.is_some()) {
            return Ok(Some(refusal("filesystem policy", "filesystem")));
        }
        // Its instances reach nothing: a policy allowing some egress would be silently moot.
        if exec.request.network.is_some() || session.is_some_and(|r| r.network.is_some()) {
            return Ok(Some(refusal(
                "network policy (AIO instances have no egress)",
                "network",
            )));
        }
        Ok(None)
    }

    /// The place and run stages: a session's node, or the node the strategy picks (the
    /// executor queue group while no node is known). `Err` is a transient failure.
    pub async fn dispatch(&self, exec: &Execution) -> Result<ExecResult, SchedulerError> {
        if exec.tier == Tier::Aio {
            if let Some(error) = self.aio_refusal(exec).await? {
                return Ok(exec.refused(ExecStatus::Rejected, Tier::Aio, error));
            }
            return self.aio.run(exec).await;
        }
        let limits = exec.limits;
        let mut request = exec.request.clone();
        request.timeout_ms = Some(limits.timeout_ms);
        request.limits = Some(limits.as_limits());
        // A warm pooled container has no egress socket and no filesystem policy's mounts: a
        // run with either gets a container of its own (a session's runs get the session's
        // policies on the way). A session's work is tier `session` (`decide_tier`).
        let kind = match (&request.session_id, exec.tier) {
            (Some(session_id), _) => RunKind::Session {
                session_id: session_id.clone(),
            },
            (None, Tier::Session) => RunKind::Isolated {
                session_grade: true,
            },
            _ if exec.request.network.is_some() || exec.filesystem.is_some() => RunKind::Isolated {
                session_grade: false,
            },
            (None, _) => RunKind::Pooled,
        };
        let mut run = ExecutorRun::new(exec.id.clone(), request, kind)?;
        run.tenant = exec.tenant.clone();
        run.network = exec.request.network.clone();
        run.template = exec.template.clone();
        run.filesystem = exec.filesystem.clone();
        let needs = Requirements {
            cpus: limits.cpus,
            memory_mb: limits.memory_mb,
            backend: Backend::Docker,
            tenant: exec.tenant.clone(),
        };
        let mut deadline = Duration::from_millis(limits.timeout_ms) + self.exec_grace;
        // A template that adds packages runs in its own image; its first run on a node waits
        // for the image's build (and on a bwrap node, its export).
        let own_image = exec.template.as_ref().is_some_and(|t| !t.image.is_base());
        if own_image {
            deadline += self.template_build_grace;
        }
        let scope = exec.scope();
        if let Some(session_id) = &exec.request.session_id {
            return self
                .affinity
                .dispatch_session(
                    session_id,
                    exec.session.clone(),
                    &mut run,
                    needs,
                    deadline,
                    &scope,
                )
                .await;
        }
        let light = light_backend(
            self.ephemeral_backend,
            exec.tier,
            exec.risk.level,
            exec.request.session_id.is_some(),
        )
        // A sandbox has no network: a run with a policy (its own or its template's) needs a
        // container with an egress proxy.
        .filter(|_| run.network.is_none());
        if let Some(backend) = light {
            let needs = Requirements {
                backend,
                ..needs.clone()
            };
            if let Some(result) = self.place(backend, &run, needs, deadline, &scope).await? {
                return Ok(result);
            }
            // `SANDMESH_EPHEMERAL_BACKEND=bwrap`: light work runs there or not at all.
            if self.ephemeral_backend == EphemeralBackend::Bwrap {
                return Err(SchedulerError::NoExecutor { backend });
            }
        }
        self.place(Backend::Docker, &run, needs, deadline, &scope)
            .await?
            .ok_or(SchedulerError::NoExecutor {
                backend: Backend::Docker,
            })
    }

    /// Runs `run` on a node of `backend` the strategy picks, trying another when the chosen
    /// one is gone. Docker work goes to the queue group while no node is known; `None`: no
    /// node of `backend` answered (for a light backend: none is known either).
    async fn place(
        &self,
        backend: Backend,
        run: &ExecutorRun,
        needs: Requirements,
        deadline: Duration,
        scope: &kit::AuditScope,
    ) -> Result<Option<ExecResult>, SchedulerError> {
        let mut exclude = Vec::new();
        for _ in 0..PLACEMENT_ATTEMPTS {
            let placement = self.placer.pick_waiting(&needs, &exclude, deadline).await?;
            let node = placement.as_ref().map(|p| p.node().to_string());
            if node.is_none() && backend != Backend::Docker {
                return Ok(None);
            }
            let decision = placement.as_ref().map(Placement::decision);
            self.placer.audit_placed(scope, run, decision);
            let call = self
                .executor
                .run_watched(&self.placer, backend, placement, run, deadline, scope)
                .await;
            match call {
                Call::NoResponders => match node {
                    Some(node) => exclude.push(node),
                    None => break,
                },
                other => return settle(other, node, run).map(Some),
            }
        }
        Ok(None)
    }
}
