//! `Heartbeat` actor: keeps this instance's key `<service>.<instance_id>` alive in KV
//! `sandbox_nodes`. Each beat is a fresh message with a per-message TTL (`Nats-TTL`), so a crashed
//! instance's key expires by itself within the TTL and watchers see a purge; a clean stop
//! deletes the key at once.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::HeaderMap;
use messages::heartbeat::Heartbeat;
use messages::Encoding;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::retry::{retry, RetryPolicy};
use crate::KitError;

/// Live gauges reported in each beat: `(capacity, load, metrics)`.
pub type LoadProbe = Arc<dyn Fn() -> Load + Send + Sync>;

#[derive(Debug, Clone, Default)]
pub struct Load {
    pub capacity: u32,
    pub load: u32,
    pub metrics: std::collections::BTreeMap<String, f64>,
    pub labels: std::collections::BTreeMap<String, String>,
    /// The isolation backends an executor offers; empty for other services.
    pub backends: Vec<messages::executor::Backend>,
    /// The host's CPU and memory (executors only; see [`crate::resources::HostSampler`]).
    pub resources: Option<messages::heartbeat::Resources>,
}

/// What this instance holds per tenant, reported in each beat (see [`crate::peer_counts`]).
pub type TenantProbe = Arc<dyn Fn() -> std::collections::BTreeMap<String, u32> + Send + Sync>;

pub enum HeartbeatMsg {
    Beat,
}

pub struct HeartbeatActor;

pub struct HeartbeatArgs {
    pub js: jetstream::Context,
    pub bucket: String,
    pub service: String,
    pub instance_id: String,
    pub version: String,
    pub interval: Duration,
    pub probe: LoadProbe,
    /// Services whose tenants have a quota on what they hold report it here.
    pub tenants: Option<TenantProbe>,
}

pub struct HeartbeatState {
    args: HeartbeatArgs,
    started_at: u64,
    /// `$KV.<bucket>.<key>`: beats are published directly so each carries its own TTL.
    subject: String,
    /// Why a TTL of three intervals: one lost beat must not make a live instance vanish.
    ttl: Duration,
}

/// Messages to the bucket with TTL need whole seconds, at least one; rounded up, so a key never
/// lives shorter than the three intervals it is meant to cover (1.5 s must not become 1 s).
fn ttl_header(ttl: Duration) -> String {
    format!("{}s", ttl.as_secs_f64().ceil().max(1.0) as u64)
}

impl HeartbeatState {
    /// Stores one beat, retried within `policy` (a cluster may be electing the bucket's
    /// leader, or, just after creating it, not know its subject yet on every server).
    async fn beat(&self, policy: RetryPolicy) -> Result<(), KitError> {
        let load = (self.args.probe)();
        let hb = Heartbeat {
            service: self.args.service.clone(),
            instance_id: self.args.instance_id.clone(),
            version: self.args.version.clone(),
            started_at: self.started_at,
            sent_at: messages::now_ms(),
            capacity: load.capacity,
            load: load.load,
            metrics: load.metrics,
            labels: load.labels,
            backends: load.backends,
            resources: load.resources,
            tenants: self.args.tenants.as_ref().map(|t| t()).unwrap_or_default(),
        };
        let payload =
            bytes::Bytes::from(
                Encoding::Json
                    .encode(&hb)
                    .map_err(|source| KitError::Encode {
                        what: "the heartbeat",
                        source,
                    })?,
            );
        let mut headers = HeaderMap::new();
        headers.insert("Nats-TTL", ttl_header(self.ttl).as_str());
        let store = || async {
            let (subject, headers) = (self.subject.clone(), headers.clone());
            self.args
                .js
                .publish_with_headers(subject, headers, payload.clone())
                .await?
                .await
        };
        retry("storing the heartbeat", policy, store)
            .await
            .map_err(|e| KitError::jetstream("storing the heartbeat", e))?;
        Ok(())
    }
}

impl Actor for HeartbeatActor {
    type Msg = HeartbeatMsg;
    type State = HeartbeatState;
    type Arguments = HeartbeatArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: HeartbeatArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let key = messages::heartbeat::heartbeat_key(&args.service, &args.instance_id);
        let ttl = (args.interval * 3).max(Duration::from_secs(1));
        let state = HeartbeatState {
            subject: format!("$KV.{}.{key}", args.bucket),
            ttl,
            started_at: messages::now_ms(),
            args,
        };
        // The first beat before anything else, so the instance is visible as soon as it runs.
        state.beat(RetryPolicy::JETSTREAM).await?;
        myself.send_interval(state.args.interval, || HeartbeatMsg::Beat);
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            HeartbeatMsg::Beat => {
                // Disconnected, a beat would only wait out the ack timeout (and hold up a
                // stop); the first beat after the reconnect renews the key within its TTL.
                let client = state.args.js.client();
                if client.connection_state() != async_nats::connection::State::Connected {
                    tracing::debug!("NATS is not connected; heartbeat skipped");
                    return Ok(());
                }
                // A missed beat is survivable (the TTL covers three); never crash on it, and
                // retry no longer than until the next one is due.
                let policy = RetryPolicy {
                    budget: state.args.interval,
                    ..RetryPolicy::ACK
                };
                if let Err(e) = state.beat(policy).await {
                    tracing::warn!(error = %e, "heartbeat failed");
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let key = messages::heartbeat::heartbeat_key(&state.args.service, &state.args.instance_id);
        let delete = async {
            let kv = state.args.js.get_key_value(&state.args.bucket).await?;
            kv.delete(&key).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        };
        // With NATS gone the key expires by its TTL instead.
        let client = state.args.js.client();
        let step = "delete the heartbeat key";
        if let Some(Err(e)) = crate::shutdown::bounded(&client, step, delete).await {
            tracing::warn!(error = %e, "could not remove heartbeat key");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_header(Duration::from_millis(1500)), "2s");
        assert_eq!(ttl_header(Duration::from_secs(6)), "6s");
        assert_eq!(ttl_header(Duration::from_millis(300)), "1s");
    }
}
