//! `Router`: the entry point of `sandbox.v1.browser.<action>`. It owns the session → browser
//! session map and the warm pool, so "which browser serves this session" is decided in one
//! place, in order: a session's second request can never start a second browser.
//!
//! Sessions are linked children: when one stops (close, idle, session closed, a failure) the
//! router forgets it, and its browser container goes with it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use kit::RequestContext;
use messages::browser::{
    BrowserAction, BrowserBackend, BrowserCommand, BrowserPayload, BrowserRequest, BrowserResult,
};
use messages::quota::Quota;
use messages::tenancy::{scoped, Tenant};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::error::{BrowserError, Reply};
use crate::session::{
    open, Act, BrowserSession, SessionArgs, SessionMsg, Shared, Started, TakeWarm,
};

/// How long a session waits for the router to hand it a warm browser.
const TAKE_WITHIN: Duration = Duration::from_secs(5);

/// One request on its way to a session, as it came: its action is the subject's.
pub struct Routed {
    pub ctx: RequestContext,
    pub payload: BrowserPayload,
    pub reply: Reply,
}

pub enum RouterMsg {
    Act(Box<Routed>),
    /// The session was closed (its `session_closed` audit event): drop its browser.
    SessionClosed(String),
    /// A session takes a warm browser, if there is one.
    Take(RpcReplyPort<Option<Started>>),
    /// A warm-pool start finished.
    Warmed(Result<Box<Started>, BrowserError>),
    /// Sessions and warm browsers now (for the heartbeat and tests).
    Stats(RpcReplyPort<RouterStats>),
}

impl RouterMsg {
    /// The request handler's constructor (`kit::actor_handler`).
    pub fn act(ctx: RequestContext, payload: BrowserPayload, reply: Reply) -> Self {
        RouterMsg::Act(Box::new(Routed {
            ctx,
            payload,
            reply,
        }))
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouterStats {
    pub sessions: usize,
    pub warm: usize,
}

pub struct RouterState {
    shared: Arc<Shared>,
    sessions: HashMap<String, ActorRef<SessionMsg>>,
    /// Session of each child actor, to forget it when it stops.
    by_actor: HashMap<ractor::ActorId, String>,
    /// Started and connected browsers, no session's yet.
    warm: VecDeque<Started>,
    warming: usize,
}

pub struct Router;

impl Actor for Router {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        shared: Arc<Shared>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = RouterState {
            shared,
            sessions: HashMap::new(),
            by_actor: HashMap::new(),
            warm: VecDeque::new(),
            warming: 0,
        };
        state.replenish(&myself);
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for (_, session) in state.sessions.drain() {
            let _ = session
                .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(30)))
                .await;
        }
        state.warm.clear();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RouterMsg::Act(routed) => {
                let Routed {
                    ctx,
                    payload,
                    reply,
                } = *routed;
                state.route(&myself, ctx, payload, reply).await;
            }
            RouterMsg::SessionClosed(id) => {
                if let Some(session) = state.sessions.get(&id) {
                    tracing::info!(session_id = %id, "session closed; closing its browser");
                    session.stop(Some("session closed".into()));
                }
            }
            RouterMsg::Take(reply) => {
                let _ = reply.send(state.warm.pop_front());
                state.replenish(&myself);
            }
            RouterMsg::Warmed(result) => {
                state.warming -= 1;
                match result {
                    Ok(c) => state.warm.push_back(*c),
                    // Not retried at once: a broken image or daemon would spin. The next
                    // Take tries again.
                    Err(e) => tracing::warn!(error = %e, "warm browser failed to start"),
                }
            }
            RouterMsg::Stats(reply) => {
                let _ = reply.send(RouterStats {
                    sessions: state.sessions.len(),
                    warm: state.warm.len(),
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
        // A session that stops (or fails) is forgotten; the router itself carries on.
        let stopped = match &event {
            SupervisionEvent::ActorTerminated(cell, _, _) => Some(cell.get_id()),
            SupervisionEvent::ActorFailed(cell, e) => {
                tracing::warn!(error = %e, "a browser session failed");
                Some(cell.get_id())
            }
            _ => None,
        };
        if let Some(id) = stopped.and_then(|a| state.by_actor.remove(&a)) {
            state.sessions.remove(&id);
            state.replenish(&myself);
        }
        Ok(())
    }
}

impl RouterState {
    /// Starts warm browsers until the pool is full, within the instance's browser limit.
    fn replenish(&mut self, myself: &ActorRef<RouterMsg>) {
        let config = &self.shared.config;
        while self.warm.len() + self.warming < config.warm_pool
            && self.sessions.len() + self.warm.len() + self.warming < config.max_browsers
        {
            self.warming += 1;
            let containers = self.shared.containers.clone();
            let me = myself.clone();
            tokio::spawn(async move {
                let started = open(&containers).await.map(Box::new);
                // A router that stopped meanwhile drops the message, and with it the container.
                let _ = me.cast(RouterMsg::Warmed(started));
            });
        }
    }

    /// Hands the request to its session's actor, starting one if needed; a request that
    /// cannot be is answered here.
    async fn route(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        ctx: RequestContext,
        payload: BrowserPayload,
        reply: Reply,
    ) {
        let req = match self.check(&ctx, payload) {
            Ok(req) => req,
            Err(e) => return refuse(reply, e),
        };
        let session = match self.sessions.get(&req.session_id) {
            Some(s) => s.clone(),
            None if req.command == BrowserCommand::Close => {
                // Nothing to close: answer without starting a browser.
                let _ = reply.send(Ok(BrowserResult {
                    ok: true,
                    value: Some(serde_json::json!({"closed": false})),
                    ..Default::default()
                }));
                return;
            }
            None => match self
                .spawn_session(myself, ctx.caller.tenant(), &req.session_id)
                .await
            {
                Ok(s) => s,
                Err(e) => return refuse(reply, e),
            },
        };
        let act = Box::new(Act { req, ctx, reply });
        if let Err(ractor::MessagingErr::SendErr(SessionMsg::Act(act))) =
            session.cast(SessionMsg::Act(act))
        {
            refuse(act.reply, BrowserError::Closing);
        }
    }

    /// Everything about a request that needs no browser: the action, the session id, the
    /// action's fields, the backend. Returns the request, its session known from here on by
    /// its tenant-scoped id (two tenants' `s1` are two sessions, two browsers).
    fn check(
        &self,
        ctx: &RequestContext,
        payload: BrowserPayload,
    ) -> Result<BrowserRequest, BrowserError> {
        let token = ctx.subject.rsplit('.').next().unwrap_or_default();
        let action = BrowserAction::parse(token).ok_or_else(|| BrowserError::UnknownAction {
            token: token.to_string(),
        })?;
        let session_id = ctx
            .caller
            .scope("session_id", &payload.session_id)
            .map_err(BrowserError::SessionId)?;
        let req = BrowserRequest {
            session_id,
            ..BrowserRequest::parse(action, payload)?
        };
        if BrowserBackend::route(&req) == BrowserBackend::Aio {
            return Err(BrowserError::AioBackend);
        }
        Ok(req)
    }

    async fn spawn_session(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        tenant: Option<&Tenant>,
        session_id: &str,
    ) -> Result<ActorRef<SessionMsg>, BrowserError> {
        let max = self.shared.config.max_browsers;
        if self.sessions.len() >= max {
            return Err(BrowserError::TooManyBrowsers { max });
        }
        if let Some(tenant) = tenant {
            // Its sessions are the keys with its prefix (ids are scoped by it). Counted on this
            // instance, which is the mesh's: one router per mesh until sessions are routed to
            // the router holding their browser (lib.rs); then peers' counts are added as the
            // pools do (`kit::PeerCounts`).
            let prefix = scoped(tenant, "");
            let held = self.sessions.keys().filter(|k| k.starts_with(&prefix));
            let quotas = self.shared.quotas.of(tenant);
            quotas.admit(tenant, Quota::Browsers, held.count() as u64, 1)?;
        }
        let args = SessionArgs {
            session_id: session_id.to_string(),
            shared: self.shared.clone(),
            take_warm: take_warm(myself),
        };
        let (session, _) = Actor::spawn_linked(None, BrowserSession, args, myself.get_cell())
            .await
            .map_err(BrowserError::SessionActor)?;
        self.by_actor
            .insert(session.get_id(), session_id.to_string());
        self.sessions
            .insert(session_id.to_string(), session.clone());
        Ok(session)
    }
}

/// Answers a request the router could not hand to a session.
fn refuse(reply: Reply, e: BrowserError) {
    tracing::debug!(error = %e, "request not routed");
    let _ = reply.send(Err(e));
}

/// How a session takes a warm browser: it asks the router, which owns the pool.
fn take_warm(router: &ActorRef<RouterMsg>) -> TakeWarm {
    let router = router.clone();
    Arc::new(move || {
        let router = router.clone();
        Box::pin(async move {
            match router.call(RouterMsg::Take, Some(TAKE_WITHIN)).await {
                Ok(ractor::rpc::CallResult::Success(warm)) => warm,
                _ => None,
            }
        })
    })
}
