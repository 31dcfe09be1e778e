//! `sandmesh status`: the live instances, from `$SRV.PING` answers and `sandbox_nodes`
//! heartbeats, as one table.

use std::collections::BTreeMap;
use std::time::Duration;

use messages::heartbeat::Heartbeat;
use sandmesh_client::MeshClient;

#[derive(Default)]
struct Row {
    service: String,
    version: String,
    answers_ping: bool,
    heartbeat: Option<Heartbeat>,
}

pub async fn run(mesh: &MeshClient, json: bool) -> anyhow::Result<i32> {
    let status = mesh.status();
    let mut rows: BTreeMap<(String, String), Row> = BTreeMap::new();
    for ping in status.ping(None, Duration::from_millis(500)).await? {
        let row = rows
            .entry((ping.service.clone(), ping.instance_id))
            .or_default();
        row.service = ping.service;
        row.version = ping.version;
        row.answers_ping = true;
    }
    for hb in status.heartbeats().await? {
        let row = rows
            .entry((hb.service.clone(), hb.instance_id.clone()))
            .or_default();
        row.service = hb.service.clone();
        row.version = hb.version.clone();
        row.heartbeat = Some(hb);
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
        outln!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    if rows.is_empty() {
        outln!("no live instances (is the mesh up? `sandmesh up`)");
        return Ok(1);
    }
    outln!(
        "{:<18} {:<28} {:<8} {:<5} {:>9} {:>5}  metrics",
        "SERVICE",
        "INSTANCE",
        "VERSION",
        "PING",
        "CAPACITY",
        "LOAD"
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
        outln!(
            "{service:<18} {instance:<28} {:<8} {ping:<5} {cap:>9} {load:>5}  {metrics}",
            r.version
        );
    }
    Ok(0)
}
