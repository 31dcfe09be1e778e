//! Discovery through the NATS services protocol (`$SRV.PING` / `$SRV.INFO`): every instance
//! of every service answers, so a request collects answers for a while instead of taking one.

use std::time::Duration;

use futures::StreamExt;
use messages::heartbeat::Heartbeat;
use messages::service::{srv, SrvVerb};
use messages::ServiceName;
use serde::de::DeserializeOwned;

use crate::{ClientError, MeshClient, Result};

/// One instance answering `$SRV.PING`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The service's name as it announces it (a [`ServiceName`] for sandmesh's own).
    pub service: String,
    /// The instance id the service reports in its metadata (the micro id otherwise).
    pub instance_id: String,
    pub version: String,
}

impl Instance {
    pub fn service_name(&self) -> Option<ServiceName> {
        self.service.parse().ok()
    }
}

#[derive(Debug, Clone)]
pub struct StatusClient {
    mesh: MeshClient,
}

impl StatusClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// Every instance (of `service`, or of all services) that answers within `window`.
    pub async fn ping(
        &self,
        service: Option<ServiceName>,
        window: Duration,
    ) -> Result<Vec<Instance>> {
        let replies: Vec<async_nats::service::PingResponse> =
            self.collect(srv(SrvVerb::Ping, service), window).await?;
        Ok(replies
            .into_iter()
            .map(|p| Instance {
                instance_id: p.metadata.get("instance_id").cloned().unwrap_or(p.id),
                service: p.name,
                version: p.version,
            })
            .collect())
    }

    /// The endpoint descriptions of every instance answering within `window`.
    pub async fn info(
        &self,
        service: Option<ServiceName>,
        window: Duration,
    ) -> Result<Vec<async_nats::service::Info>> {
        self.collect(srv(SrvVerb::Info, service), window).await
    }

    /// The live heartbeats in `sandbox_nodes`: one per instance (expired ones are gone), in
    /// key order. No bucket yet means no instance ever beat.
    pub async fn heartbeats(&self) -> Result<Vec<Heartbeat>> {
        let bucket = self.mesh.subjects().nodes_bucket();
        let failed = |e| ClientError::transport(format!("reading {bucket}"), e);
        let Ok(kv) = self.mesh.jetstream().get_key_value(&bucket).await else {
            return Ok(Vec::new());
        };
        let mut keys: Vec<String> = kv
            .keys()
            .await
            .map_err(|e| ClientError::transport(format!("reading {bucket}"), e))?
            .filter_map(|k| async move { k.ok() })
            .collect()
            .await;
        keys.sort();
        let mut out = Vec::new();
        for key in keys {
            // Expired between listing and reading: not live any more.
            let Some(value) = kv.get(&key).await.map_err(failed)? else {
                continue;
            };
            match serde_json::from_slice::<Heartbeat>(&value) {
                Ok(hb) => out.push(hb),
                Err(e) => {
                    return Err(ClientError::codec(
                        format!("heartbeat {key} in {bucket}"),
                        e,
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Sends one request and gathers every reply that arrives within `window` (replies that
    /// do not decode are someone else's protocol and skipped).
    async fn collect<T: DeserializeOwned>(
        &self,
        subject: String,
        window: Duration,
    ) -> Result<Vec<T>> {
        let nats = self.mesh.nats();
        let failed = |e| ClientError::transport(format!("asking {subject}"), e);
        let inbox = nats.new_inbox();
        let mut replies = nats.subscribe(inbox.clone()).await.map_err(failed)?;
        nats.publish_with_reply(subject.clone(), inbox, Default::default())
            .await
            .map_err(|e| ClientError::transport(format!("asking {subject}"), e))?;
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + window;
        while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, replies.next()).await {
            if let Ok(reply) = serde_json::from_slice(&msg.payload) {
                out.push(reply);
            }
        }
        Ok(out)
    }
}
