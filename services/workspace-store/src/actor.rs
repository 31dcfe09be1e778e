//! `StoreActor`: the bridge between the endpoints and the store. Each request becomes a
//! message; the actor starts the operation as its own task (all state is in JetStream, so
//! operations on different sessions — and on one session, thanks to compare-and-set — run
//! side by side) and the task answers the reply port. The actor itself never waits on I/O.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kit::RequestContext;
use messages::tenancy::Caller;
use messages::workspace::{
    Ack, WsArchive, WsCleaned, WsCleanup, WsEntry, WsFetch, WsFile, WsInit, WsList, WsListing,
    WsPath, WsRead, WsRestore, WsRestored, WsSnapshot, WsUploadAck, WsUploadChunk, WsUsage,
    WsUsageRequest, WsWrite,
};
use messages::ErrorBody;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::Instrument;

use crate::error::StoreError;
use crate::store::Workspaces;

pub type Reply<T> = RpcReplyPort<Result<T, ErrorBody>>;

pub enum StoreMsg {
    Init(RequestContext, WsInit, Reply<WsUsage>),
    Write(RequestContext, WsWrite, Reply<WsEntry>),
    Read(RequestContext, WsRead, Reply<WsFile>),
    List(RequestContext, WsList, Reply<WsListing>),
    Stat(RequestContext, WsPath, Reply<WsEntry>),
    Delete(RequestContext, WsPath, Reply<Ack>),
    Snapshot(RequestContext, WsSnapshot, Reply<WsArchive>),
    Restore(RequestContext, WsRestore, Reply<WsRestored>),
    Usage(RequestContext, WsUsageRequest, Reply<WsUsage>),
    Cleanup(RequestContext, WsCleanup, Reply<WsCleaned>),
    Upload(RequestContext, WsUploadChunk, Reply<WsUploadAck>),
    Fetch(RequestContext, WsFetch, Reply<WsFile>),
}

pub struct StoreActor;

tokio::task_local! {
    /// Who asked for the operation running in this task: its audit events name the caller's
    /// tenant, account and user, as its span gives them the trace id.
    pub static CALLER: Caller;
}

/// Runs one operation in its own task (inside the request's span and with its caller, so
/// audit events carry its trace id and who asked) and answers `reply` with its outcome.
fn spawn_op<T, F, Fut>(store: &Arc<Workspaces>, caller: Caller, reply: Reply<T>, op: F)
where
    T: Send + 'static,
    F: FnOnce(Arc<Workspaces>) -> Fut,
    Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
{
    let metrics = store.metrics.clone();
    metrics.in_flight.fetch_add(1, Ordering::Relaxed);
    let work = op(store.clone());
    tokio::spawn(CALLER.scope(
        caller,
        async move {
            let outcome = work.await.map_err(ErrorBody::from);
            metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
            if let Err(e) = &outcome {
                if e.code >= 500 {
                    tracing::warn!(code = e.code, message = %e.message, "workspace operation failed");
                }
            }
            let _ = reply.send(outcome);
        }
        .instrument(tracing::Span::current()),
    ));
}

impl Actor for StoreActor {
    type Msg = StoreMsg;
    type State = Arc<Workspaces>;
    type Arguments = Arc<Workspaces>;

    async fn pre_start(
        &self,
        _myself: ActorRef<StoreMsg>,
        store: Arc<Workspaces>,
    ) -> Result<Arc<Workspaces>, ActorProcessingErr> {
        Ok(store)
    }

    async fn handle(
        &self,
        _myself: ActorRef<StoreMsg>,
        msg: StoreMsg,
        store: &mut Arc<Workspaces>,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            StoreMsg::Init(ctx, r, reply) => {
                spawn_op(store, ctx.caller, reply, |s| async move { s.init(r).await })
            }
            StoreMsg::Write(ctx, r, reply) => {
                spawn_op(
                    store,
                    ctx.caller,
                    reply,
                    |s| async move { s.write(r).await },
                )
            }
            StoreMsg::Read(ctx, r, reply) => {
                spawn_op(store, ctx.caller, reply, |s| async move { s.read(r).await })
            }
            StoreMsg::List(ctx, r, reply) => {
                spawn_op(store, ctx.caller, reply, |s| async move { s.list(r).await })
            }
            StoreMsg::Stat(ctx, r, reply) => {
                spawn_op(store, ctx.caller, reply, |s| async move { s.stat(r).await })
            }
            StoreMsg::Delete(ctx, r, reply) => {
                spawn_op(
                    store,
                    ctx.caller,
                    reply,
                    |s| async move { s.delete(r).await },
                )
            }
            StoreMsg::Snapshot(ctx, r, reply) => spawn_op(
                store,
                ctx.caller,
                reply,
                |s| async move { s.snapshot(r).await },
            ),
            StoreMsg::Restore(ctx, r, reply) => spawn_op(
                store,
                ctx.caller,
                reply,
                |s| async move { s.restore(r).await },
            ),
            StoreMsg::Usage(ctx, r, reply) => {
                spawn_op(
                    store,
                    ctx.caller,
                    reply,
                    |s| async move { s.usage(r).await },
                )
            }
            StoreMsg::Cleanup(ctx, r, reply) => spawn_op(
                store,
                ctx.caller,
                reply,
                |s| async move { s.cleanup(r).await },
            ),
            StoreMsg::Upload(ctx, r, reply) => spawn_op(store, ctx.caller, reply, |s| async move {
                s.uploads.append(r).await
            }),
            StoreMsg::Fetch(ctx, r, reply) => {
                spawn_op(
                    store,
                    ctx.caller,
                    reply,
                    |s| async move { s.fetch(r).await },
                )
            }
        }
        Ok(())
    }
}
