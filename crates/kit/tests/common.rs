//! A demo service for the kit's tests: an `Echo` actor behind one endpoint.

use std::time::Duration;

use kit::{KitConfig, RequestContext, Runtime, ServiceInfo};
use messages::ErrorBody;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EchoReq {
    pub text: String,
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub fail_with: Option<u16>,
    /// Echo the text this many times (0 = once): makes replies larger than requests.
    #[serde(default)]
    pub repeat: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EchoResp {
    pub text: String,
    pub instance: String,
}

pub enum EchoMsg {
    Echo(
        RequestContext,
        EchoReq,
        RpcReplyPort<Result<EchoResp, ErrorBody>>,
    ),
}

pub struct Echo {
    pub instance: String,
}

/// Requests each instance has started handling, so tests can wait for "in flight" by polling.
static STARTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

pub fn started(instance: &str) -> usize {
    STARTED
        .lock()
        .unwrap()
        .iter()
        .filter(|i| *i == instance)
        .count()
}

impl Actor for Echo {
    type Msg = EchoMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<EchoMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<EchoMsg>,
        msg: EchoMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let EchoMsg::Echo(_ctx, req, reply) = msg;
        let instance = self.instance.clone();
        STARTED.lock().unwrap().push(instance.clone());
        // Slow work runs outside the actor so it keeps taking messages.
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(req.delay_ms)).await;
            let out = match req.fail_with {
                Some(code) => Err(ErrorBody::new(
                    messages::ErrorKind::from_code(code),
                    "asked to fail",
                )),
                None => Ok(EchoResp {
                    text: req.text.repeat(req.repeat.max(1)),
                    instance,
                }),
            };
            let _ = reply.send(out);
        });
        Ok(())
    }
}

pub const ECHO_SUBJECT: &str = "sandbox.v1.echo";

pub async fn start_echo(url: &str, instance: &str, options: kit::EndpointOptions) -> Runtime {
    start_echo_on(KitConfig::for_url(url), instance, options, ECHO_SUBJECT).await
}

pub async fn start_echo_on(
    mut config: KitConfig,
    instance: &str,
    options: kit::EndpointOptions,
    subject: &str,
) -> Runtime {
    config.instance_id = instance.to_string();
    config.heartbeat_interval = Duration::from_millis(200);
    config.shutdown_grace = Duration::from_secs(5);
    let runtime = Runtime::start(
        config,
        ServiceInfo {
            name: "echo".into(),
            version: "1.0.0".into(),
            description: "demo".into(),
        },
    )
    .await
    .expect("runtime starts");
    let (actor, _) = Actor::spawn(
        None,
        Echo {
            instance: instance.to_string(),
        },
        (),
    )
    .await
    .unwrap();
    runtime
        .serve_with(
            subject.to_string(),
            options,
            kit::actor_handler(actor, EchoMsg::Echo),
        )
        .await
        .unwrap();
    runtime
}
