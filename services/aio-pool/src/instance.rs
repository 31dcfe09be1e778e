//! `Instance`: one per AIO container. Its mailbox is the serialisation of calls into the
//! instance (upstream corrupts a shell session under concurrent calls, deer-flow#1433): an
//! execution is awaited inside `handle`, so the next call waits for it. It checks its
//! container's health on a timer and stops when the container stops answering; it removes
//! the container when it stops, for whatever reason (release, idle, used up, died, shutdown).

use std::time::{Duration, Instant};

use messages::browser::AioExecResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::aio_client::AioClient;
use crate::docker::OwnedContainer;
use crate::error::PoolError;

/// Consecutive failed health checks after which the instance is declared dead.
const HEALTH_FAILURES: u32 = 2;
const HEALTH_LIMIT: Duration = Duration::from_secs(2);
/// How long the browser may take to start for `/v1/browser/info`.
const BROWSER_LIMIT: Duration = Duration::from_secs(40);

pub enum InstanceMsg {
    Exec {
        session_id: String,
        command: String,
        timeout: Duration,
        max_output_chars: usize,
        /// The instance reached `max_use_count`: stop after answering.
        retire_after: bool,
        reply: RpcReplyPort<Result<AioExecResult, PoolError>>,
    },
    /// The CDP URL (starts the browser).
    BrowserUrl(RpcReplyPort<Result<String, PoolError>>),
    Health,
}

pub struct Instance;

pub struct InstanceArgs {
    pub container: OwnedContainer,
    pub client: AioClient,
    /// Tells the pool an execution finished (idle time counts from here).
    pub touched: Box<dyn Fn() + Send + Sync>,
    pub health_interval: Duration,
}

pub struct InstanceState {
    args: InstanceArgs,
    failures: u32,
}

impl Actor for Instance {
    type Msg = InstanceMsg;
    type State = InstanceState;
    type Arguments = InstanceArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<InstanceMsg>,
        args: InstanceArgs,
    ) -> Result<InstanceState, ActorProcessingErr> {
        myself.send_interval(args.health_interval, || InstanceMsg::Health);
        Ok(InstanceState { args, failures: 0 })
    }

    async fn handle(
        &self,
        myself: ActorRef<InstanceMsg>,
        msg: InstanceMsg,
        state: &mut InstanceState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            InstanceMsg::Exec {
                session_id,
                command,
                timeout,
                max_output_chars,
                retire_after,
                reply,
            } => {
                let started = Instant::now();
                let result = state
                    .args
                    .client
                    .bash_exec(&command, timeout, max_output_chars)
                    .await;
                let exec_ms = messages::exec::Timing::ms(started.elapsed());
                let answer = result
                    .map(|r| {
                        let status = match (r.status.as_str(), r.exit_code) {
                            ("timed_out" | "killed", _) => "timeout",
                            (_, Some(0)) => "ok",
                            _ => "error",
                        };
                        AioExecResult {
                            session_id,
                            instance_id: state.args.container.to_string(),
                            status: status.into(),
                            exit_code: r.exit_code,
                            stdout: r.stdout.unwrap_or_default(),
                            stderr: r.stderr.unwrap_or_default(),
                            exec_ms,
                            retired: retire_after,
                        }
                    })
                    .map_err(|source| PoolError::Instance {
                        what: "the AIO instance did not run the command",
                        source,
                    });
                reply.send(answer).ok();
                if retire_after {
                    myself.stop(Some("used up (max_use_count)".into()));
                } else {
                    (state.args.touched)();
                }
            }
            InstanceMsg::BrowserUrl(reply) => {
                let answer = state
                    .args
                    .client
                    .browser_info(BROWSER_LIMIT)
                    .await
                    .map(|info| info.cdp_url)
                    .map_err(|source| PoolError::Instance {
                        what: "the AIO instance's browser",
                        source,
                    });
                reply.send(answer).ok();
            }
            InstanceMsg::Health => match state.args.client.health(HEALTH_LIMIT).await {
                Ok(()) => state.failures = 0,
                Err(e) => {
                    state.failures += 1;
                    tracing::warn!(container = %state.args.container, failures = state.failures, error = %e, "AIO instance health check failed");
                    if state.failures >= HEALTH_FAILURES {
                        myself.stop(Some(format!("unhealthy: {e}")));
                    }
                }
            },
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<InstanceMsg>,
        state: &mut InstanceState,
    ) -> Result<(), ActorProcessingErr> {
        state.args.container.remove().await;
        Ok(())
    }
}
