//! `sandmesh status`: the live instances, from `$SRV.PING` answers and `sandbox_nodes`
//! heartbeats, as one table.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use messages::heartbeat::Heartbeat;
use messages::Subjects;

#[derive(Default)]
struct Row {
    service: String,
    version: String,
    answers_ping: bool,
    heartbeat: Option<Heartbeat>,
}

/// Collects every `$SRV.PING` answer that arrives within `window`.
async fn ping_all(
    client: &async_nats::Client,
    window: Duration,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await?;
    client
        .publish_with_reply("$SRV.PING", inbox, "".into())
        .await?;
    client.flush().await?;
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, replies.next()).await {
        if let Ok(v) = serde_json::from_slice(&msg.payload) {
            out.push(v);
        }
    }
    Ok(out)
}

pub async fn run(
    client: &async_nats::Client,
    subjects: &Subjects,
    json: bool,
) -> anyhow::Result<i32> {
    let mut rows: BTreeMap<(String, String), Row> = BTreeMap::new();
    for ping in ping_all(client, Duration::from_millis(500)).await? {
        let service = ping["name"].as_str().unwrap_or("?").to_string();
        let instance = ping["metadata"]["instance_id"]
            .as_str()
            .or(ping["id"].as_str())
            .unwrap_or("?")
            .to_string();
        let row = rows.entry((service.clone(), instance)).or_default();
        row.service = service;
        row.version = ping["version"].as_str().unwrap_or("").to_string();
        row.answers_ping = true;
    }
    let js = async_nats::jetstream::new(client.clone());
    if let Ok(kv) = js.get_key_value(subjects.nodes_bucket()).await {
        let mut keys = kv.keys().await?;
        while let Some(Ok(key)) = keys.next().await {
            let Ok(Some(value)) = kv.get(&key).await else {
                continue;
            };
            let Ok(hb) = serde_json::from_slice::<Heartbeat>(&value) else {
                continue;
            };
            let row = rows
                .entry((hb.service.clone(), hb.instance_id.clone()))
                .or_default();
            row.service = hb.service.clone();
            row.version = hb.version.clone();
            row.heartbeat = Some(hb);
        }
    }
    if json {
        let list: Vec<_> = rows
            .iter()
            .map(|((service, instance), r)| {
                serde_json::json!({
                    "service": service, "instance": instance, "version": r.version,
                    "ping": r.answers_ping, "heartbeat": r.heartbeat,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    if rows.is_empty() {
        println!("no live instances (is the mesh up? `sandmesh up`)");
        return Ok(1);
    }
    println!(
        "{:<18} {:<28} {:<8} {:<5} {:>9} {:>5}  metrics",
        "SERVICE", "INSTANCE", "VERSION", "PING", "CAPACITY", "LOAD"
    );
    let now = messages::now_ms();
    for ((service, instance), r) in &rows {
        let (cap, load, metrics) = match &r.heartbeat {
            Some(hb) => (
                hb.capacity.to_string(),
                hb.load.to_string(),
                hb.metrics
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .chain([format!("beat={}ms ago", now.saturating_sub(hb.sent_at))])
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            None => ("-".into(), "-".into(), "no heartbeat".into()),
        };
        let ping = if r.answers_ping { "yes" } else { "no" };
        println!(
            "{service:<18} {instance:<28} {:<8} {ping:<5} {cap:>9} {load:>5}  {metrics}",
            r.version
        );
    }
    Ok(0)
}
