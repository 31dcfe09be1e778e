//! `Containers`: the Docker backend's actor under the node's `ExecutorNode`. It sends pooled
//! runs to a warm container, isolated runs to a container made for them alone and session
//! runs to the session's `SessionContainer`, and owns the `WarmPool`s and every session actor
//! as linked children (a failed pool is restarted; a failed session is forgotten). Admission,
//! drain and the janitor are the node's (`executor_node`).
//!
//! A run in a template (`ExecutorRun::template`) first gets its image ([`TemplateImages`],
//! built on first use, off this actor) and then runs like any other, in containers of that
//! image: a template in use gets a warm pool of its own (its `warm_pool` size, fixed; only
//! the node's own pool grows with demand), started on its first run, so an unused template
//! costs nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use executor_node::template_images::{ImageError, TemplateImages};
use executor_node::{Admitted, ExecutorError, NodeState};
use messages::exec::ExecStatus;
use messages::executor::RunKind;
use messages::proc::{ProcCall, ProcReply};
use messages::template::{RunTemplate, TemplateRan};
use messages::validate::Ceilings;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::demand::Sizing;
use crate::docker::{ContainerKind, ContainerLimits};
use crate::execution::{Health, RunFailure, Runner};
use crate::gauges::ContainerGauges;
use crate::proc_error::ProcError;
use crate::session::{SessionArgs, SessionContainer, SessionError, SessionMsg};
use crate::warm_pool::{WarmPool, WarmPoolArgs, WarmPoolMsg};

pub enum ContainersMsg {
    /// An admitted run (boxed: it travels through this mailbox by value).
    Run(Box<Admitted>),
    /// A template run's image is known (or could not be had): it runs now.
    Resolved(Box<Admitted>, Result<String, ImageError>),
    /// Closes a session's container; answers whether there was one.
    Close(String, RpcReplyPort<bool>),
    /// The end of a drain: close every session.
    CloseAll(RpcReplyPort<()>),
    /// An operation on a session's background processes, for its session actor (boxed: the
    /// largest call would make every message of this mailbox its size).
    Proc(
        Box<ProcCall>,
        RpcReplyPort<Result<ProcReply, ExecutorError>>,
    ),
}

pub struct Containers;

pub struct ContainersArgs {
    pub runner: Runner,
    pub node: Arc<NodeState>,
    pub gauges: Arc<ContainerGauges>,
}

pub struct ContainersState {
    runner: Runner,
    node: Arc<NodeState>,
    gauges: Arc<ContainerGauges>,
    ceilings: Ceilings,
    pool: ActorRef<WarmPoolMsg>,
    /// The warm pools of the template images in use here, by image.
    template_pools: HashMap<String, ActorRef<WarmPoolMsg>>,
    images: TemplateImages,
    sessions: HashMap<String, ActorRef<SessionMsg>>,
}

fn default_limits(c: &Ceilings) -> ContainerLimits {
    ContainerLimits {
        memory_mb: c.default_memory_mb.max(16),
        cpus: c.default_cpus,
        pids: c.default_pids.max(8),
    }
}

/// A warm pool of `runner`'s image: the node's own (`template` `None`), or a template's.
async fn spawn_pool(
    myself: &ActorRef<ContainersMsg>,
    runner: &Runner,
    node: &Arc<NodeState>,
    gauges: &Arc<ContainerGauges>,
    template: Option<&RunTemplate>,
) -> Result<ActorRef<WarmPoolMsg>, ActorProcessingErr> {
    let config = &runner.config;
    let sizing = match template {
        None => Sizing {
            floor: config.warm_pool,
            max: config.warm_pool_max,
            window: config.warm_pool_window,
        },
        // A template's pool keeps the size its template declares: each template's stock is
        // memory of an image of its own, and its author sized it (0: none kept warm).
        Some(t) => {
            let size = t.warm_pool.map_or(config.warm_pool, |n| n as usize);
            Sizing {
                floor: size,
                max: size,
                window: config.warm_pool_window,
            }
        }
    };
    let args = WarmPoolArgs {
        sandboxes: runner.sandboxes.clone(),
        template: template.map(|t| t.name.clone()),
        node: node.clone(),
        gauges: gauges.clone(),
        sizing,
        limits: default_limits(&runner.config.node.ceilings),
    };
    let (pool, _) = Actor::spawn_linked(None, WarmPool, args, myself.get_cell()).await?;
    Ok(pool)
}

impl ContainersState {
    /// The runner and warm pool for containers of `image` (`None`: the node's own), the
    /// template's pool started on its first run here.
    async fn for_image(
        &mut self,
        myself: &ActorRef<ContainersMsg>,
        image: Option<&str>,
        template: Option<&RunTemplate>,
    ) -> Result<(Runner, ActorRef<WarmPoolMsg>), ActorProcessingErr> {
        let image = match image {
            Some(image) if image != self.runner.sandboxes.spec.image => image,
            _ => return Ok((self.runner.clone(), self.pool.clone())),
        };
        let runner = self.runner.with_image(image);
        if let Some(pool) = self.template_pools.get(image) {
            return Ok((runner, pool.clone()));
        }
        let pool = spawn_pool(myself, &runner, &self.node, &self.gauges, template).await?;
        self.template_pools.insert(image.to_string(), pool.clone());
        Ok((runner, pool))
    }

    /// Runs an admitted run in containers of `image` (`None`: the node's own).
    async fn dispatch(
        &mut self,
        myself: &ActorRef<ContainersMsg>,
        run: Admitted,
        image: Option<&str>,
    ) -> Result<(), ActorProcessingErr> {
        let template = run.job.run.template.clone();
        let (runner, pool) = self.for_image(myself, image, template.as_ref()).await?;
        match run.job.run.kind().clone() {
            RunKind::Session { session_id } => {
                self.run_session(myself, session_id, run, runner, pool)
                    .await
            }
            RunKind::Pooled | RunKind::Isolated { .. } => {
                self.run_single_use(run, runner, pool);
                Ok(())
            }
        }
    }

    /// A run in a single-use container: a warm one from the pool (pooled), or one made for
    /// this run alone (isolated; also a pooled run's fallback when the pool is empty). The
    /// container goes, with its lease, right after the answer.
    fn run_single_use(&self, run: Admitted, runner: Runner, pool: ActorRef<WarmPoolMsg>) {
        let node = self.node.clone();
        self.node.tasks.spawn(async move {
            // A warm container is made without any filesystem policy's mounts.
            let pooled = run.job.run.kind() == &RunKind::Pooled && run.job.run.filesystem.is_none();
            let mut container = if pooled {
                pool.call(WarmPoolMsg::Take, Some(Duration::from_secs(5)))
                    .await
                    .ok()
                    .and_then(|r| r.success_or(()).ok())
                    .flatten()
            } else {
                None
            };
            let mut attempts = 0;
            let result = loop {
                attempts += 1;
                let mut c = match container.take() {
                    Some(c) => c,
                    None => {
                        let kind = if pooled {
                            ContainerKind::Warm
                        } else {
                            ContainerKind::Isolated
                        };
                        let limits = ContainerLimits::from(&run.job.limits);
                        let network = run.job.run.network.as_ref();
                        let filesystem = run.job.run.filesystem.as_ref();
                        match runner
                            .start_container(&node, kind, None, limits, network, filesystem)
                            .await
                        {
                            Ok(c) => c,
                            Err(e) => {
                                let job = &run.job;
                                break runner.failed(
                                    job,
                                    ExecStatus::Internal,
                                    &RunFailure::NoContainer(e),
                                    job.accepted,
                                );
                            }
                        }
                    }
                };
                let (result, health) = runner.execute(&mut c, &run.job).await;
                // A warm container found dead (killed from outside) costs a cold start, not
                // the execution: it never began, so it is retried once.
                if health == Health::Unusable && attempts < 2 {
                    continue;
                }
                // Single use, whatever happened: the lease removes it, off the caller's clock.
                break result;
            };
            run.answer(Ok(result));
            if pooled {
                let _ = pool.cast(WarmPoolMsg::Replenish);
            }
        });
    }

    /// A session run goes to the session's container; a new session's container is made
    /// from `runner`'s image (a session keeps the image it started with).
    async fn run_session(
        &mut self,
        myself: &ActorRef<ContainersMsg>,
        session_id: String,
        run: Admitted,
        runner: Runner,
        pool: ActorRef<WarmPoolMsg>,
    ) -> Result<(), ActorProcessingErr> {
        let mut run = Box::new(run);
        // Twice at most: a session actor that just stopped (idle) is replaced once.
        for _ in 0..2 {
            let actor = match self.sessions.get(&session_id) {
                Some(a) => a.clone(),
                None => {
                    if self.sessions.len() >= self.runner.config.max_sessions {
                        let held = self.sessions.len();
                        run.answer(Err(SessionError::Full { held }.into()));
                        return Ok(());
                    }
                    let args = SessionArgs {
                        session_id: session_id.clone(),
                        runner: runner.clone(),
                        pool: pool.clone(),
                        node: self.node.clone(),
                        gauges: self.gauges.clone(),
                        idle: self.runner.config.session_idle,
                        limits: default_limits(&self.ceilings),
                        network: run.job.run.network.clone(),
                        filesystem: run.job.run.filesystem.clone(),
                    };
                    let (actor, _) =
                        Actor::spawn_linked(None, SessionContainer, args, myself.get_cell())
                            .await?;
                    self.sessions.insert(session_id.clone(), actor.clone());
                    actor
                }
            };
            match actor.cast(SessionMsg::Run(run)) {
                Err(ractor::MessagingErr::SendErr(SessionMsg::Run(back))) => {
                    self.sessions.remove(&session_id);
                    run = back;
                }
                // Delivered; or dropped with the message, which answers the caller.
                _ => return Ok(()),
            }
        }
        run.answer(Err(SessionError::Restarting.into()));
        Ok(())
    }

    fn forget(&mut self, cell: &ActorCell) {
        self.sessions.retain(|_, a| a.get_id() != cell.get_id());
    }
}

impl Actor for Containers {
    type Msg = ContainersMsg;
    type State = ContainersState;
    type Arguments = ContainersArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ContainersArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let pool = spawn_pool(&myself, &args.runner, &args.node, &args.gauges, None).await?;
        Ok(ContainersState {
            images: TemplateImages::new(&args.runner.sandboxes.spec.image),
            template_pools: HashMap::new(),
            ceilings: args.runner.config.node.ceilings.clone(),
            runner: args.runner,
            node: args.node,
            gauges: args.gauges,
            pool,
            sessions: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ContainersMsg::Run(run) => match run.job.run.template.clone() {
                None => state.dispatch(&myself, *run, None).await?,
                // Possibly a build of minutes: never in this actor's handler.
                Some(template) => {
                    let images = state.images.clone();
                    state.node.tasks.spawn(async move {
                        let image = images.image(&template).await;
                        let _ = myself.cast(ContainersMsg::Resolved(run, image));
                    });
                }
            },
            ContainersMsg::Resolved(run, image) => {
                let mut run = *run;
                match image {
                    Ok(image) => {
                        run.ran = run.job.run.template.as_ref().map(|t| TemplateRan {
                            name: t.name.clone(),
                            image: image.clone(),
                        });
                        state.dispatch(&myself, run, Some(&image)).await?
                    }
                    Err(e) => run.answer(Err(e.into())),
                }
            }
            ContainersMsg::Close(session_id, reply) => match state.sessions.remove(&session_id) {
                Some(actor) => {
                    tokio::spawn(async move {
                        let _ = actor.stop_and_wait(Some("closed".into()), None).await;
                        let _ = reply.send(true);
                    });
                }
                None => {
                    let _ = reply.send(false);
                }
            },
            ContainersMsg::Proc(call, reply) => match state.sessions.get(call.session_id()) {
                // The session actor answers (or, stopped meanwhile, drops the port: 503).
                Some(actor) => {
                    let _ = actor.cast(SessionMsg::Proc(*call, reply));
                }
                None => {
                    let _ = reply.send(Err(ProcError::NoSession.into()));
                }
            },
            ContainersMsg::CloseAll(reply) => {
                let sessions: Vec<_> = state.sessions.drain().map(|(_, a)| a).collect();
                tokio::spawn(async move {
                    for actor in sessions {
                        let _ = actor.stop_and_wait(Some("drained".into()), None).await;
                    }
                    let _ = reply.send(());
                });
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Never the default (which stops the parent): a session ending is routine, and a
        // failed pool is replaced.
        match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => state.forget(&cell),
            SupervisionEvent::ActorFailed(cell, e) => {
                if cell.get_id() == state.pool.get_id() {
                    tracing::error!(error = %e, "warm pool failed; restarting it");
                    state.pool =
                        spawn_pool(&myself, &state.runner, &state.node, &state.gauges, None)
                            .await?;
                } else if let Some(image) = state
                    .template_pools
                    .iter()
                    .find(|(_, p)| p.get_id() == cell.get_id())
                    .map(|(image, _)| image.clone())
                {
                    // Started again by the template's next run.
                    tracing::error!(error = %e, %image, "a template's warm pool failed");
                    state.template_pools.remove(&image);
                } else {
                    tracing::warn!(error = %e, "a session actor failed");
                    state.forget(&cell);
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Every container of this node goes: sessions, then the pools.
        let wait = Some(Duration::from_secs(30));
        let sessions = state.sessions.drain().map(|(_, a)| async move {
            let _ = a.stop_and_wait(Some("shutdown".into()), wait).await;
        });
        futures::future::join_all(sessions).await;
        let _ = state.pool.stop_and_wait(None, wait).await;
        let pools = state.template_pools.drain().map(|(_, p)| async move {
            let _ = p.stop_and_wait(None, wait).await;
        });
        futures::future::join_all(pools).await;
        Ok(())
    }
}
