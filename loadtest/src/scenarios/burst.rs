//! `burst`: N async jobs published at once; the time until every result is stored, and the
//! check that nothing was lost or doubled: the acked ids against the results stream, read back
//! in order from the sequence it had before the burst.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::{stream, StreamExt};
use messages::exec::Language;

use messages::exec::ExecResult;
use sandmesh_client::decode_reply;

use crate::client::{close_session, error_status, exec_sync, open_session};
use crate::ids::IdCheck;
use crate::programs::tiny;
use crate::report::BurstReport;
use crate::scenarios::exec::{tier_request, ExecTier};
use crate::scenarios::Ctx;
use crate::stats::Counts;

/// Publishes in flight at once: enough to saturate JetStream, bounded so acks keep up.
const PUBLISH_IN_FLIGHT: usize = 512;

/// What the reader collected: every stored result's id (in order) and status.
#[derive(Default)]
struct Seen {
    order: Vec<String>,
    distinct: HashSet<String>,
    statuses: Counts,
    /// The first error message of each status that is not `ok`.
    examples: BTreeMap<String, String>,
    last_at: Option<Instant>,
}

pub async fn burst(
    ctx: &mut Ctx,
    jobs: u64,
    tier: ExecTier,
    sessions: usize,
    limit: Duration,
) -> anyhow::Result<()> {
    let mesh = ctx.mesh.clone();
    let language = Language::Python;
    let (code, _, _) = tiny(language);
    let mut session_ids = Vec::new();
    if tier != ExecTier::Ephemeral {
        for _ in 0..sessions.max(1) {
            let id = open_session(&mesh, language).await?;
            exec_sync(&mesh, &tier_request(language, code, tier, Some(&id)), None).await;
            session_ids.push(id);
        }
    }

    let mut results = mesh.js.get_stream(mesh.subjects.results_stream()).await?;
    let start_seq = results.info().await?.state.last_sequence;
    let consumer = results
        .create_consumer(pull::OrderedConfig {
            filter_subject: mesh.subjects.results_all(),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: start_seq + 1,
            },
            ..Default::default()
        })
        .await?;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let reader = {
        let (seen, prefix) = (seen.clone(), mesh.subjects.result(""));
        let mut messages = consumer.messages().await?;
        tokio::spawn(async move {
            while let Some(Ok(msg)) = messages.next().await {
                let id = msg
                    .subject
                    .as_str()
                    .strip_prefix(&prefix)
                    .unwrap_or_default()
                    .to_string();
                let decoded: Result<ExecResult, _> =
                    decode_reply(&msg.subject, msg.headers.as_ref(), &msg.payload);
                let (status, detail) = match decoded {
                    Ok(r) => (r.status.as_str().to_string(), r.error.map(|e| e.message)),
                    Err(e) => (error_status(&e), Some(e.to_string())),
                };
                if let Ok(mut s) = seen.lock() {
                    if let Some(d) = detail.filter(|_| status != "ok") {
                        s.examples.entry(status.clone()).or_insert(d);
                    }
                    s.distinct.insert(id.clone());
                    s.order.push(id);
                    s.statuses.add(&status);
                    s.last_at = Some(Instant::now());
                }
            }
        })
    };

    let started = Instant::now();
    let requests: Vec<_> = (0..jobs)
        .map(|i| {
            let session = session_ids.get(i as usize % session_ids.len().max(1));
            tier_request(language, code, tier, session.map(String::as_str))
        })
        .collect();
    let exec = mesh.api.exec();
    let published: Vec<(String, Result<bool, String>)> = stream::iter(requests)
        .map(|req| {
            let exec = exec.clone();
            async move {
                let id = req.execution_id.clone().unwrap_or_default();
                let r = exec.submit(&req).await;
                (
                    id,
                    r.map(|job| !job.duplicate).map_err(|e| error_status(&e)),
                )
            }
        })
        .buffer_unordered(PUBLISH_IN_FLIGHT)
        .collect()
        .await;
    let publish_s = started.elapsed().as_secs_f64();
    let mut acked = Vec::with_capacity(published.len());
    let mut publish_errors = Counts::default();
    for (id, r) in published {
        match r {
            Ok(true) => acked.push(id),
            Ok(false) => publish_errors.add("duplicate_ack"),
            Err(e) => publish_errors.add(&e),
        }
    }
    eprintln!(
        "burst: {} of {jobs} jobs acked in {publish_s:.2} s",
        acked.len()
    );

    // Bounded wait until every acked id has its result.
    let deadline = started + limit;
    let mut timed_out = false;
    for round in 0u64.. {
        let (have, missing) = {
            let s = seen
                .lock()
                .map_err(|_| anyhow::anyhow!("reader panicked"))?;
            (
                s.distinct.len(),
                acked.iter().filter(|id| !s.distinct.contains(*id)).count(),
            )
        };
        if round % 4 == 0 {
            eprint!(
                "\rburst: {have} results stored, {missing} to go, {:.0}s   ",
                started.elapsed().as_secs_f64()
            );
        }
        if missing == 0 {
            break;
        }
        if Instant::now() > deadline {
            timed_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!();
    // A late second store of an id would move the stream's sequence: read it after results
    // stopped arriving for a moment (bounded).
    let quiet_until = Instant::now() + Duration::from_secs(10);
    let mut last_seq = results.info().await?.state.last_sequence;
    while Instant::now() < quiet_until {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = results.info().await?.state.last_sequence;
        if now == last_seq {
            break;
        }
        last_seq = now;
    }
    reader.abort();
    let (all_stored_s, check, statuses, examples) = {
        let s = seen
            .lock()
            .map_err(|_| anyhow::anyhow!("reader panicked"))?;
        let all_stored_s = s
            .last_at
            .map_or(0.0, |t| t.saturating_duration_since(started).as_secs_f64());
        let mut statuses = s.statuses.clone();
        statuses.merge(&publish_errors);
        (
            all_stored_s,
            IdCheck::compute(&acked, &s.order, last_seq - start_seq),
            statuses,
            s.examples.clone(),
        )
    };
    for id in &session_ids {
        close_session(&mesh, id).await;
    }
    ctx.report.burst = Some(BurstReport {
        jobs,
        tier: match tier {
            ExecTier::Ephemeral => "ephemeral".into(),
            tier => format!("{} ({} sessions)", tier.as_str(), session_ids.len()),
        },
        publish_s: (publish_s * 1000.0).round() / 1000.0,
        all_stored_s: (all_stored_s * 1000.0).round() / 1000.0,
        results_per_s: if all_stored_s > 0.0 {
            (check.results_distinct as f64 / all_stored_s).round()
        } else {
            0.0
        },
        statuses,
        examples,
        check,
        timed_out,
    });
    Ok(())
}
