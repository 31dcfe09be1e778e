//! `--metrics-addr`: the mesh's Prometheus endpoint scraped before and after the scenario, and
//! `sandbox_executions_total` compared, per status and tier, with the results the run stored
//! (every message `SANDBOX_RESULTS` gained meanwhile). The counter moves once per stored
//! result, so the two must agree while nothing else uses the mesh.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::StreamExt;
use messages::exec::ExecResult;
use sandmesh_client::decode_reply;
use sandmesh_client::metrics::{scrape, Samples};
use serde::{Deserialize, Serialize};

use crate::mesh::Mesh;

const EXECUTIONS: &str = "sandbox_executions_total";

/// How long the stored results may take to read back.
const READ_LIMIT: Duration = Duration::from_secs(120);

/// One scrape and where the results stream stood at that moment.
pub struct Checkpoint {
    samples: Samples,
    last_sequence: u64,
}

/// One `status/tier` row of the comparison.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CounterRow {
    pub status: String,
    pub tier: String,
    pub before: f64,
    pub after: f64,
    /// Results of this status and tier stored during the run.
    pub stored: u64,
}

impl CounterRow {
    fn consistent(&self) -> bool {
        self.after - self.before == self.stored as f64
    }
}

/// A scrape while the scenario ran: how far the counter and the results stream had moved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DuringSample {
    pub elapsed_s: f64,
    /// `sandbox_executions_total` minus its value before the run.
    pub counted: f64,
    /// Results stored since the run began (read just after the scrape, so it may be ahead).
    pub stored: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsCheck {
    pub addr: String,
    pub rows: Vec<CounterRow>,
    /// Scrapes taken while the scenario ran.
    pub during: Vec<DuringSample>,
    /// `sandbox_execution_duration_seconds_count`, before and after.
    pub durations_before: f64,
    pub durations_after: f64,
    pub consistent: bool,
}

/// Scrapes once the mesh is quiet: two scrapes with the same executions counter around the
/// read of the stream's last sequence, so no result lands between the two figures.
pub async fn checkpoint(mesh: &Mesh, addr: SocketAddr) -> anyhow::Result<Checkpoint> {
    for _ in 0..50 {
        let first = scrape(addr).await?;
        let last_sequence = stream_last_sequence(mesh).await?;
        let second = scrape(addr).await?;
        if first.sum(EXECUTIONS, &[]) == second.sum(EXECUTIONS, &[]) {
            return Ok(Checkpoint {
                samples: second,
                last_sequence,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("the executions counter at {addr} never stood still for a checkpoint")
}

async fn stream_last_sequence(mesh: &Mesh) -> anyhow::Result<u64> {
    let mut stream = mesh.js.get_stream(mesh.subjects.results_stream()).await?;
    Ok(stream.info().await?.state.last_sequence)
}

/// Scrapes every `every` until `stop`, each scrape beside the results stored so far.
pub async fn watch(
    mesh: Mesh,
    addr: SocketAddr,
    before: (f64, u64),
    every: Duration,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Vec<DuringSample> {
    let (counted_before, sequence_before) = before;
    let started = std::time::Instant::now();
    let mut samples = Vec::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = &mut stop => return samples,
        }
        // A failed scrape mid-run is left out; the final check reports failures.
        let Ok(s) = scrape(addr).await else { continue };
        let Ok(sequence) = stream_last_sequence(&mesh).await else {
            continue;
        };
        samples.push(DuringSample {
            elapsed_s: started.elapsed().as_secs_f64(),
            counted: s.sum(EXECUTIONS, &[]) - counted_before,
            stored: sequence.saturating_sub(sequence_before),
        });
    }
}

impl Checkpoint {
    /// The executions counter and the results stream's last sequence.
    pub fn position(&self) -> (f64, u64) {
        (self.samples.sum(EXECUTIONS, &[]), self.last_sequence)
    }
}

/// Compares two checkpoints with the results stored between them, and prints the table.
pub async fn compare(
    mesh: &Mesh,
    addr: SocketAddr,
    before: &Checkpoint,
    after: &Checkpoint,
    during: Vec<DuringSample>,
) -> anyhow::Result<MetricsCheck> {
    let stored = stored_between(mesh, before.last_sequence, after.last_sequence)
        .await
        .context("reading the results stored during the run")?;
    let mut rows: BTreeMap<(String, String), CounterRow> = BTreeMap::new();
    for (checkpoint, is_after) in [(before, false), (after, true)] {
        for s in checkpoint.samples.matching(EXECUTIONS, &[]) {
            let key = (label(&s.labels, "status"), label(&s.labels, "tier"));
            let row = rows.entry(key).or_default();
            if is_after {
                row.after = s.value;
            } else {
                row.before = s.value;
            }
        }
    }
    for (key, n) in stored {
        rows.entry(key).or_default().stored = n;
    }
    let rows: Vec<CounterRow> = rows
        .into_iter()
        .map(|((status, tier), row)| CounterRow {
            status,
            tier,
            ..row
        })
        .collect();
    let durations = |c: &Checkpoint| {
        c.samples
            .sum("sandbox_execution_duration_seconds_count", &[])
    };
    let check = MetricsCheck {
        addr: addr.to_string(),
        consistent: rows.iter().all(CounterRow::consistent),
        rows,
        during,
        durations_before: durations(before),
        durations_after: durations(after),
    };
    println!("{}", human(&check));
    Ok(check)
}

fn label(labels: &BTreeMap<String, String>, name: &str) -> String {
    labels.get(name).cloned().unwrap_or_default()
}

/// Every result stored after `from` up to `to` (stream sequences), by status and tier.
async fn stored_between(
    mesh: &Mesh,
    from: u64,
    to: u64,
) -> anyhow::Result<BTreeMap<(String, String), u64>> {
    let mut counts = BTreeMap::new();
    if to <= from {
        return Ok(counts);
    }
    let stream = mesh.js.get_stream(mesh.subjects.results_stream()).await?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: mesh.subjects.results_all(),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from + 1,
            },
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let read = async {
        while let Some(msg) = messages.next().await {
            let msg = msg?;
            let seq = msg.info().map_err(anyhow::Error::msg)?.stream_sequence;
            if seq > to {
                break;
            }
            let r: ExecResult = decode_reply(&msg.subject, msg.headers.as_ref(), &msg.payload)?;
            let key = (r.status.as_str().to_string(), r.tier.as_str().to_string());
            *counts.entry(key).or_default() += 1;
            if seq == to {
                break;
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(READ_LIMIT, read)
        .await
        .context("timed out")??;
    Ok(counts)
}

/// The before/after table.
pub fn human(check: &MetricsCheck) -> String {
    let mut out = format!(
        "metrics at {} (sandbox_executions_total against the results stored meanwhile):\n",
        check.addr
    );
    out.push_str(&format!(
        "  {:<14} {:<10} {:>10} {:>10} {:>8} {:>8}\n",
        "status", "tier", "before", "after", "delta", "stored"
    ));
    for r in &check.rows {
        out.push_str(&format!(
            "  {:<14} {:<10} {:>10} {:>10} {:>8} {:>8}{}\n",
            r.status,
            r.tier,
            r.before,
            r.after,
            r.after - r.before,
            r.stored,
            if r.consistent() { "" } else { "  MISMATCH" }
        ));
    }
    if !check.during.is_empty() {
        out.push_str("  during the run (counted / stored since it began):");
        for d in &check.during {
            out.push_str(&format!(" {:.0}s {}/{}", d.elapsed_s, d.counted, d.stored));
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "  sandbox_execution_duration_seconds_count: {} -> {}\n  {}",
        check.durations_before,
        check.durations_after,
        if check.consistent {
            "consistent: every stored result counted once"
        } else {
            "INCONSISTENT (another client using the mesh during the run also moves the counters)"
        }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_consistent_when_the_delta_equals_the_stored_results() {
        let row = CounterRow {
            status: "ok".into(),
            tier: "ephemeral".into(),
            before: 10.0,
            after: 15.0,
            stored: 5,
        };
        assert!(row.consistent());
        let off = CounterRow { stored: 4, ..row };
        assert!(!off.consistent());
        let check = MetricsCheck {
            addr: "127.0.0.1:9464".into(),
            rows: vec![off],
            ..Default::default()
        };
        assert!(human(&check).contains("MISMATCH"));
    }
}
