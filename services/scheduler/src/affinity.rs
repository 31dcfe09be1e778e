//! Session affinity and failover: a session's executions go to the node holding
//! its container. When that node stops answering or its heartbeat vanishes, the session is marked
//! lost and re-placed on a healthy node with `session_restored`; the executor there restores the
//! workspace (the files live in workspace-store) and the result says process state was lost.

use std::time::{Duration, Instant};

use kit::{AuditScope, Auditor};
use messages::audit::{SessionLost, SessionOpened};
use messages::exec::{ExecResult, ExecStatus};
use messages::executor::{Backend, ExecutorRun};
use messages::session::{SessionOpen, SessionRecord, SessionState};
use messages::ServiceName;
use sandmesh_client::{MeshClient, TemplateClient, WorkspaceClient};

use crate::error::{SchedulerError, SessionEnd};
use crate::execution::terminal;
use crate::executor_runner::{settle, Call, ExecutorRunner};
use crate::placement::Requirements;
use crate::placer::{Placement, Placer, PLACEMENT_ATTEMPTS};
use crate::sessions::{mark_lost, Change, SessionTable};

/// Where a session's execution runs: its node, whether its process state was lost on the
/// way, the placement when a new node was picked, and the record as placed.
struct Placed {
    node: String,
    restored: bool,
    placement: Option<Placement>,
    record: SessionRecord,
}

/// A use of a session, for its idle clock.
#[derive(Clone, Copy)]
enum Use {
    /// A run started; it may go on until `deadline` from now.
    Running { deadline: Duration },
    /// A run ended (counted).
    Finished,
}

/// Why no execution may start in the session any more: closed, or its TTL ran out (the
/// expiry sweep closes it soon; until then it must not take work).
fn ended(record: &SessionRecord) -> Option<SchedulerError> {
    let expired = record.expires_at.is_some_and(|at| at <= messages::now_ms());
    let why = match record.state {
        SessionState::Closed => SessionEnd::Closed,
        _ if expired => SessionEnd::Expired,
        _ => return None,
    };
    Some(SchedulerError::SessionEnded {
        id: record.session_id.clone(),
        why,
    })
}

#[derive(Clone)]
pub struct SessionAffinity {
    sessions: SessionTable,
    placer: Placer,
    executor: ExecutorRunner,
    /// A session opens with its workspace made and its template checked.
    workspace: WorkspaceClient,
    templates: TemplateClient,
    auditor: Auditor,
    /// Session bookkeeping off the reply's path; waited for at shutdown.
    background: tokio_util::task::TaskTracker,
}

impl SessionAffinity {
    pub fn new(
        sessions: SessionTable,
        placer: Placer,
        executor: ExecutorRunner,
        mesh: &MeshClient,
        auditor: Auditor,
        background: tokio_util::task::TaskTracker,
    ) -> Self {
        Self {
            sessions,
            placer,
            executor,
            workspace: mesh.workspace(),
            templates: mesh.templates(),
            auditor,
            background,
        }
    }

    pub fn sessions(&self) -> &SessionTable {
        &self.sessions
    }

    /// Runs `run` on the session's node. `known` is the session's record when the caller has
    /// just read it (saving a round trip); otherwise it is read here, and opened when missing.
    pub async fn dispatch_session(
        &self,
        session_id: &str,
        known: Option<SessionRecord>,
        run: &mut ExecutorRun,
        needs: Requirements,
        deadline: Duration,
        scope: &AuditScope,
    ) -> Result<ExecResult, SchedulerError> {
        let mut record = match known {
            Some(record) => record,
            None => {
                self.ensure_session(session_id, run.request().requested_by.clone(), scope)
                    .await?
            }
        };
        // The session's container is made with the session's egress socket, if it has one,
        // and the mounts of its filesystem policy added to its template's.
        run.network = record.network.clone();
        run.filesystem = match (run.filesystem.take(), &record.filesystem) {
            (Some(template), Some(session)) => Some(template.union(session)),
            (template, session) => template.or_else(|| session.clone()),
        };
        let template = run.template.as_ref().map(|t| t.name.clone());
        for _ in 0..PLACEMENT_ATTEMPTS {
            if let Some(error) = ended(&record) {
                return Ok(terminal(
                    &run.execution_id,
                    run.request(),
                    ExecStatus::Rejected,
                    error.into(),
                ));
            }
            let Placed {
                node,
                restored,
                placement,
                record: placed,
            } = self
                .place_session(&record, template.as_deref(), &needs, deadline, scope)
                .await?;
            // Checked again as placed: the session may have taken another run's template
            // since it was read (two first runs at once), or was opened by this run.
            if let Err(error) = placed.admits_template(template.as_deref()) {
                return Ok(terminal(
                    &run.execution_id,
                    run.request(),
                    ExecStatus::Rejected,
                    error,
                ));
            }
            run.session_restored = restored;
            // In use until this run's deadline: an idle close must not take the session from
            // under it.
            let (me, id, at) = (self.clone(), session_id.to_string(), node.clone());
            let busy = Use::Running { deadline };
            self.background
                .spawn(async move { me.touch_session(&id, &at, busy).await });
            // Not picked (affinity): counted on its node like a pick.
            let placement = placement.unwrap_or_else(|| self.placer.dispatched(&node));
            self.placer
                .audit_placed(scope, run, Some(placement.decision()));
            let call = self
                .executor
                .run_watched(
                    &self.placer,
                    Backend::Docker,
                    Some(placement),
                    run,
                    deadline,
                    scope,
                )
                .await;
            match call {
                Call::NoResponders => {
                    record = self.session_lost(session_id, &node, scope).await?;
                }
                Call::Lost(why) => {
                    self.session_lost(session_id, &node, scope).await?;
                    return settle(Call::Lost(why), Some(node), run);
                }
                other => {
                    let done = matches!(other, Call::Done(_));
                    let mut result = settle(other, Some(node.clone()), run)?;
                    result.session_restored |= restored;
                    if done {
                        // Bookkeeping (use count, last use) off the reply's path: two KV
                        // round trips the caller need not wait for.
                        let (me, id) = (self.clone(), session_id.to_string());
                        self.background.spawn(async move {
                            me.touch_session(&id, &node, Use::Finished).await
                        });
                    }
                    return Ok(result);
                }
            }
        }
        Err(SchedulerError::NoNodeForSession {
            id: session_id.to_string(),
        })
    }

    /// The session's record, opening it (and its workspace) on first use.
    pub async fn ensure_session(
        &self,
        session_id: &str,
        requested_by: Option<String>,
        scope: &AuditScope,
    ) -> Result<SessionRecord, SchedulerError> {
        if let Some(record) = self.sessions.get(session_id).await? {
            return Ok(record);
        }
        let open = SessionOpen {
            session_id: Some(session_id.to_string()),
            requested_by,
            ..Default::default()
        };
        self.open_session(session_id, &open, scope).await
    }

    /// Creates the workspace, then the record (idempotent: an existing record is returned).
    pub async fn open_session(
        &self,
        session_id: &str,
        open: &SessionOpen,
        scope: &AuditScope,
    ) -> Result<SessionRecord, SchedulerError> {
        if let Some(tenant) = &scope.tenant {
            self.sessions.admit_new(tenant).await?;
        }
        if let Some(name) = &open.template {
            crate::templates::lookup(&self.templates, name).await?;
        }
        self.workspace
            .init(session_id)
            .await
            .map_err(SchedulerError::calling(ServiceName::WorkspaceStore))?;
        let (record, created) = self
            .sessions
            .open(session_id, open, scope.tenant.clone())
            .await?;
        if created {
            self.auditor
                .emit(scope, SessionOpened { tier: record.tier });
        }
        Ok(record)
    }

    /// Where the session's next execution runs. A session placed for the first time takes
    /// `template` (the run's) when it was opened without one.
    async fn place_session(
        &self,
        record: &SessionRecord,
        template: Option<&str>,
        needs: &Requirements,
        wait: Duration,
        scope: &AuditScope,
    ) -> Result<Placed, SchedulerError> {
        let id = &record.session_id;
        let mut record = record.clone();
        let follow = |record: SessionRecord| Placed {
            node: record.node.clone().unwrap_or_default(),
            restored: false,
            placement: None,
            record,
        };
        if record.state == SessionState::Active {
            let node = record.node.clone().unwrap_or_default();
            if self.placer.is_alive(&node).await? {
                return Ok(follow(record));
            }
            // Its heartbeat is gone, but the registry's watch may not have marked it yet.
            record = self.session_lost(id, &node, scope).await?;
            if record.state == SessionState::Active {
                // Another scheduler re-placed it meanwhile: follow.
                return Ok(follow(record));
            }
        }
        let exclude: Vec<String> = record.lost_from.clone().into_iter().collect();
        // Like work without a session, a new placement waits (bounded by the execution's
        // deadline) for a free slot instead of failing while every node is busy.
        let until = Instant::now() + wait;
        let placement = match self.placer.pick_waiting(needs, &exclude, wait).await? {
            Some(p) => Some(p),
            // Only the node we would avoid is left; it may have come back.
            None => {
                let left = until.saturating_duration_since(Instant::now());
                self.placer.pick_waiting(needs, &[], left).await?
            }
        };
        // Dropped on every way out but the first below: the pick's count is given back.
        let placement =
            placement.ok_or_else(|| SchedulerError::NoNodeForSession { id: id.clone() })?;
        let chosen = placement.node().to_string();
        let mut restored = None;
        let stored = self
            .sessions
            .update(id, |r| match r.state {
                SessionState::Open | SessionState::Lost => {
                    let lost = r.state == SessionState::Lost;
                    if lost {
                        r.restores += 1;
                    } else if r.template.is_none() {
                        // Its first container is made now, in the image its first run names.
                        r.template = template.map(String::from);
                    }
                    r.state = SessionState::Active;
                    r.node = Some(chosen.clone());
                    r.lost_from = None;
                    restored = Some(lost);
                    Change::Write
                }
                SessionState::Active | SessionState::Closed => {
                    restored = None;
                    Change::Keep
                }
            })
            .await;
        let stored = match stored {
            Ok(Some(stored)) => stored,
            Ok(None) => return Err(SchedulerError::SessionVanished { id: id.clone() }),
            Err(e) => return Err(e.into()),
        };
        match (stored.state, stored.node.clone(), restored) {
            (SessionState::Active, Some(node), Some(lost)) => Ok(Placed {
                node,
                restored: lost,
                placement: Some(placement),
                record: stored,
            }),
            // Another scheduler placed it meanwhile: follow it there.
            (SessionState::Active, Some(_), None) => Ok(follow(stored)),
            (state, _, _) => Err(SchedulerError::SessionEnded {
                id: id.clone(),
                why: SessionEnd::Unrunnable(state),
            }),
        }
    }

    /// Marks the session lost on `node` and returns the record as it is now.
    async fn session_lost(
        &self,
        session_id: &str,
        node: &str,
        scope: &AuditScope,
    ) -> Result<SessionRecord, SchedulerError> {
        let mut changed = false;
        let record = self
            .sessions
            .update(session_id, |r| {
                changed = mark_lost(r, node);
                if changed {
                    Change::Write
                } else {
                    Change::Keep
                }
            })
            .await?
            .ok_or_else(|| SchedulerError::SessionVanished {
                id: session_id.to_string(),
            })?;
        if changed {
            let lost = SessionLost {
                node: node.to_string(),
                cause: None,
            };
            self.auditor.emit(scope, lost);
        }
        Ok(record)
    }

    /// Records a use of the session on `node`.
    async fn touch_session(&self, session_id: &str, node: &str, used: Use) {
        let now = messages::now_ms();
        let updated = self
            .sessions
            .update(session_id, |r| {
                if r.node.as_deref() != Some(node) || r.state == SessionState::Closed {
                    return Change::Keep;
                }
                match used {
                    Use::Running { deadline } => {
                        let until = now.saturating_add(deadline.as_millis() as u64);
                        r.busy_until = Some(r.busy_until.unwrap_or(0).max(until));
                    }
                    Use::Finished => r.executions += 1,
                }
                r.last_used_at = now;
                Change::Write
            })
            .await;
        if let Err(e) = updated {
            tracing::warn!(session_id, error = %e, "session use not recorded");
        }
    }
}
