//! The closed-loop load driver: `concurrency` workers each run one operation at a time until
//! `requests` operations were issued or `duration` passed, whichever comes first. Every loop is
//! bounded in count and time; a progress line on stderr shows how far it got.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::stats::{Counts, Latencies};

/// How much load one series applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub concurrency: usize,
    /// Stop after this many operations; `None`: only the duration bounds it.
    pub requests: Option<u64>,
    pub duration: Duration,
}

impl Load {
    /// The same bounds with another concurrency.
    pub fn with_concurrency(self, concurrency: usize) -> Self {
        Self {
            concurrency,
            ..self
        }
    }
}

/// The outcome of one operation.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// End-to-end time; `None` when the operation produced no reply to time (transport error).
    pub latency: Option<Duration>,
    /// `ok`, an exec status, an error kind, ...
    pub status: String,
    /// The executor's own time for this operation (`timing.exec_ms`), when it reports one.
    pub inner: Option<Duration>,
    /// What went wrong, for the first failure of each status in the report.
    pub detail: Option<String>,
}

impl Sample {
    pub fn timed(latency: Duration, status: impl Into<String>) -> Self {
        Self {
            latency: Some(latency),
            status: status.into(),
            ..Default::default()
        }
    }

    pub fn failed(status: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            status: status.into(),
            detail: Some(detail.into()),
            ..Default::default()
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// What one series measured.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub latencies: Latencies,
    /// End-to-end minus the executor's time, for operations that report it.
    pub overhead: Latencies,
    pub inner: Latencies,
    pub statuses: Counts,
    /// The first detail seen for each status that is not `ok`.
    pub examples: BTreeMap<String, String>,
    pub elapsed: Duration,
    pub completed: u64,
    pub concurrency: usize,
}

impl Run {
    pub fn absorb(&mut self, s: &Sample) {
        self.completed += 1;
        self.statuses.add(&s.status);
        if let Some(d) = s.detail.as_ref().filter(|_| s.status != "ok") {
            self.examples
                .entry(s.status.clone())
                .or_insert_with(|| d.clone());
        }
        if let Some(l) = s.latency {
            self.latencies.record(l);
            if let Some(inner) = s.inner {
                self.inner.record(inner);
                self.overhead.record(l.saturating_sub(inner));
            }
        }
    }

    /// Adds one more turn of the same series ([`alternate`]): its operations and its time.
    fn add_turn(&mut self, turn: Run) {
        self.elapsed += turn.elapsed;
        self.merge(turn);
    }

    fn merge(&mut self, other: Run) {
        self.latencies.merge(&other.latencies);
        self.overhead.merge(&other.overhead);
        self.inner.merge(&other.inner);
        self.statuses.merge(&other.statuses);
        for (k, v) in other.examples {
            self.examples.entry(k).or_insert(v);
        }
        self.completed += other.completed;
    }

    pub fn throughput(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.completed as f64 / secs
        } else {
            0.0
        }
    }
}

/// Runs `op(worker, seq)` under `load`; `seq` numbers operations from 0.
pub async fn drive<F, Fut>(label: &str, load: Load, op: F) -> Run
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Sample> + Send,
{
    let op = Arc::new(op);
    let issued = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + load.duration;
    let limit = load.requests.unwrap_or(u64::MAX);
    let mut workers = Vec::with_capacity(load.concurrency);
    for w in 0..load.concurrency.max(1) {
        let (op, issued, done, failed) = (op.clone(), issued.clone(), done.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            let mut run = Run::default();
            while Instant::now() < deadline {
                let seq = issued.fetch_add(1, Ordering::Relaxed);
                if seq >= limit {
                    break;
                }
                let sample = op(w, seq).await;
                if sample.status != "ok" {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                run.absorb(&sample);
                done.fetch_add(1, Ordering::Relaxed);
            }
            run
        }));
    }
    let finished = Arc::new(AtomicBool::new(false));
    let progress = tokio::spawn(progress_line(
        label.to_string(),
        start,
        done.clone(),
        failed.clone(),
        finished.clone(),
    ));
    let mut run = Run {
        concurrency: load.concurrency.max(1),
        ..Run::default()
    };
    for w in workers {
        if let Ok(r) = w.await {
            run.merge(r);
        }
    }
    run.elapsed = start.elapsed();
    finished.store(true, Ordering::Relaxed);
    let _ = progress.await;
    run
}

/// One operation of a series that takes turns with others ([`alternate`]); boxed so series
/// of different kinds fit in one list.
pub type TurnOp =
    Arc<dyn Fn(usize, u64) -> Pin<Box<dyn Future<Output = Sample> + Send>> + Send + Sync>;

/// Runs the `series` in turns of `turn` each (a, b, a, b, …) until every one had
/// `load.duration`, at `load.concurrency`; one [`Run`] per series, its time the sum of its
/// turns. Background load on a shared machine comes and goes within seconds: taking turns
/// spreads it over every series alike, so their ratio holds where back-to-back series would
/// each catch a different share. Bounded by time only (`load.requests` is not used).
pub async fn alternate(series: &[(String, TurnOp)], load: Load, turn: Duration) -> Vec<Run> {
    let turns = (load.duration.as_secs_f64() / turn.as_secs_f64().max(1e-3))
        .ceil()
        .max(1.0) as u32;
    let slice = Load {
        requests: None,
        duration: turn,
        ..load
    };
    let mut runs: Vec<Run> = series
        .iter()
        .map(|_| Run {
            concurrency: load.concurrency.max(1),
            ..Run::default()
        })
        .collect();
    for t in 1..=turns {
        for ((name, op), total) in series.iter().zip(&mut runs) {
            let op = op.clone();
            let label = format!("{name} (turn {t}/{turns})");
            total.add_turn(drive(&label, slice, move |w, seq| op(w, seq)).await);
        }
    }
    runs
}

/// One stderr line, rewritten every second until the series ends.
async fn progress_line(
    label: String,
    start: Instant,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    finished: Arc<AtomicBool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(1000));
    tick.tick().await;
    loop {
        let over = finished.load(Ordering::Relaxed);
        let n = done.load(Ordering::Relaxed);
        let secs = start.elapsed().as_secs_f64().max(1e-3);
        let line = format!(
            "\r{label}: {n} done, {:.0}/s, {} not ok, {secs:.0}s   ",
            n as f64 / secs,
            failed.load(Ordering::Relaxed)
        );
        {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(line.as_bytes());
            if over {
                let _ = err.write_all(b"\n");
            }
        }
        if over {
            return;
        }
        tick.tick().await;
    }
}

/// Prints a one-off progress line (for phases the driver does not run).
pub fn note(line: &str) {
    eprintln!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn request_count_bounds_the_run() {
        let load = Load {
            concurrency: 4,
            requests: Some(50),
            duration: Duration::from_secs(60),
        };
        let run = drive("count", load, |_, seq| async move {
            Sample::timed(Duration::from_micros(100 + seq), "ok")
        })
        .await;
        assert_eq!(run.completed, 50);
        assert_eq!(run.statuses.get("ok"), 50);
        assert_eq!(run.latencies.len(), 50);
    }

    #[tokio::test]
    async fn duration_bounds_the_run() {
        let load = Load {
            concurrency: 2,
            requests: None,
            duration: Duration::from_millis(200),
        };
        let run = drive("time", load, |_, _| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Sample::timed(Duration::from_millis(10), "ok")
        })
        .await;
        assert!(run.completed > 0);
        // Each worker may start one operation just before the deadline.
        assert!(run.elapsed < Duration::from_secs(5), "{:?}", run.elapsed);
    }

    #[tokio::test]
    async fn alternating_series_take_turns_and_add_up_their_turns() {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let op = |label: &'static str| -> TurnOp {
            let order = order.clone();
            Arc::new(move |_, _| {
                let order = order.clone();
                Box::pin(async move {
                    order.lock().unwrap().push(label);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    Sample::timed(Duration::from_millis(2), "ok")
                })
            })
        };
        let load = Load {
            concurrency: 2,
            requests: Some(1),
            duration: Duration::from_millis(90),
        };
        let series = [("a".to_string(), op("a")), ("b".to_string(), op("b"))];
        let runs = alternate(&series, load, Duration::from_millis(30)).await;
        let mut turns: Vec<&str> = order.lock().unwrap().clone();
        turns.dedup();
        assert_eq!(turns, ["a", "b", "a", "b", "a", "b"]);
        let count = |label| {
            order
                .lock()
                .unwrap()
                .iter()
                .filter(|l| **l == label)
                .count()
        };
        assert_eq!(runs[0].completed as usize, count("a"));
        assert_eq!(runs[1].completed as usize, count("b"));
        assert!(runs
            .iter()
            .all(|r| r.concurrency == 2 && r.statuses.get("ok") > 1));
    }

    #[tokio::test]
    async fn failures_are_counted_and_overhead_derived() {
        let load = Load {
            concurrency: 1,
            requests: Some(4),
            duration: Duration::from_secs(10),
        };
        let run = drive("mixed", load, |_, seq| async move {
            if seq % 2 == 0 {
                Sample {
                    latency: Some(Duration::from_millis(12)),
                    status: "ok".into(),
                    inner: Some(Duration::from_millis(10)),
                    detail: None,
                }
            } else {
                Sample::failed("unavailable", "no executor")
            }
        })
        .await;
        assert_eq!(run.statuses.get("ok"), 2);
        assert_eq!(run.statuses.get("unavailable"), 2);
        assert_eq!(run.latencies.len(), 2);
        assert_eq!(
            run.examples.get("unavailable").map(String::as_str),
            Some("no executor")
        );
        let overhead = run.overhead.summary();
        assert!((overhead.p50_ms - 2.0).abs() < 0.01, "{overhead:?}");
    }
}
