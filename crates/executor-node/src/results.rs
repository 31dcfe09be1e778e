//! [`ResultStore`]: what this node knows about the executions it was sent, so a run whose reply
//! was lost (core request-reply is at-most-once: a NATS server failing between node and
//! scheduler drops it) is answered, not run again. The scheduler asks
//! `executor.<backend>.<node>.status` before it calls a run lost, and may send the run again:
//!
//! - a run that is going now: the repeated request *attaches* to it and gets its answer;
//! - a run that ended: its answer is kept for [`KeepLimits::keep`] and given again;
//! - a run that ended with a transient error (429, 503: nothing ran) is not kept, so a retry
//!   runs it.
//!
//! Memory is bounded twice: kept answers by their bytes (oldest first, an answer of 1 MiB of
//! output counts as such) and every record by count. An answer dropped for the byte bound
//! leaves a small record (`forgotten`): the execution must not run a second time even though
//! its output is gone. Only records past `keep` or the count bound are forgotten entirely.
//!
//! Keys are the run's tenant and its (tenant-scoped) execution id: another tenant's run with
//! the same client id is another execution.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use messages::exec::ExecResult;
use messages::executor::{ExecutorRun, ExecutorRunStatus, ExecutorStatusQuery, RunState};
use messages::tenancy::Tenant;
use messages::ErrorKind;
use ractor::RpcReplyPort;
use tokio::time::Instant;

use crate::error::ExecutorError;

/// An answer as the caller got it (its error made the wire's body at the endpoint).
pub type Answer = Result<ExecResult, ExecutorError>;

/// Where a caller waits for its answer.
pub type Reply = RpcReplyPort<Answer>;

/// How long and how much the node keeps (`SANDMESH_EXEC_RESULT_KEEP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepLimits {
    /// How long an answer is kept after its run ended. It must outlast the scheduler's wait
    /// for a run (the run's timeout plus its grace) and its questions afterwards.
    pub keep: Duration,
    /// Records (kept answers and forgotten ones) at most; the oldest go first.
    pub max_entries: usize,
    /// Bytes of kept answers at most (output, rich outputs, errors); the oldest are forgotten
    /// first.
    pub max_bytes: usize,
}

impl Default for KeepLimits {
    fn default() -> Self {
        Self {
            keep: Duration::from_secs(600),
            max_entries: 20_000,
            max_bytes: 64 << 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    tenant: Option<Tenant>,
    execution_id: String,
}

impl Key {
    fn of_run(run: &ExecutorRun) -> Self {
        Self {
            tenant: run.tenant.clone(),
            execution_id: run.execution_id.clone(),
        }
    }

    fn of_query(q: &ExecutorStatusQuery) -> Self {
        Self {
            tenant: q.tenant.clone(),
            execution_id: q.execution_id.clone(),
        }
    }
}

struct Kept {
    /// `None`: forgotten for room.
    answer: Option<Answer>,
    bytes: usize,
    /// Tells this record from a later one of the same key in `order`.
    seq: u64,
}

#[derive(Default)]
struct Inner {
    /// Runs going now, with the callers attached to them since.
    running: HashMap<Key, Vec<Reply>>,
    finished: HashMap<Key, Kept>,
    /// Finished records, oldest first, with when each ended.
    order: VecDeque<(Key, u64, Instant)>,
    /// The records that still hold their answer, oldest first: where room is made.
    answered: VecDeque<(Key, u64)>,
    bytes: usize,
    next_seq: u64,
}

/// What a run request for a known execution got instead of a second run.
pub enum Seen {
    /// The request was attached to the run going now.
    Attached,
    /// The run had ended: this is its answer again (boxed: a result is large, and this is the
    /// rare path).
    Answered(Reply, Box<Answer>),
}

#[derive(Default)]
pub struct ResultStore {
    limits: KeepLimits,
    inner: Mutex<Inner>,
}

impl ResultStore {
    pub fn new(limits: KeepLimits) -> Self {
        Self {
            limits,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        let mut inner = self.inner.lock().expect("result store poisoned");
        inner.expire(self.limits.keep);
        inner
    }

    /// A run request: `Err(reply)` when the node has no record of its execution (the caller
    /// admits and runs it, and calls [`Self::started`]); otherwise what it got instead.
    pub fn seen(&self, run: &ExecutorRun, reply: Reply) -> Result<Seen, Reply> {
        let key = Key::of_run(run);
        let mut inner = self.lock();
        if let Some(waiters) = inner.running.get_mut(&key) {
            waiters.push(reply);
            return Ok(Seen::Attached);
        }
        match inner.finished.get(&key) {
            None => Err(reply),
            Some(Kept {
                answer: Some(answer),
                ..
            }) => Ok(Seen::Answered(reply, Box::new(answer.clone()))),
            Some(Kept { answer: None, .. }) => {
                Ok(Seen::Answered(reply, Box::new(Err(forgotten(&key)))))
            }
        }
    }

    /// The admitted run of `run` starts: later requests for it attach.
    pub fn started(&self, run: &ExecutorRun) {
        self.lock().running.insert(Key::of_run(run), Vec::new());
    }

    /// The run of `run` ended with `answer`: keeps it (unless nothing ran) and returns the
    /// callers attached meanwhile, to be answered alike.
    pub fn finished(&self, run: &ExecutorRun, answer: &Answer) -> Vec<Reply> {
        let key = Key::of_run(run);
        let mut inner = self.lock();
        let waiters = inner.running.remove(&key).unwrap_or_default();
        let nothing_ran = matches!(answer, Err(e) if matches!(e.kind(), ErrorKind::Overloaded | ErrorKind::Unavailable));
        if !nothing_ran {
            inner.keep(key, answer.clone(), &self.limits);
        }
        waiters
    }

    /// The answer to "what happened to this execution?".
    pub fn status(&self, query: &ExecutorStatusQuery) -> ExecutorRunStatus {
        let key = Key::of_query(query);
        let inner = self.lock();
        let (state, answer) = if inner.running.contains_key(&key) {
            (RunState::Running, None)
        } else {
            match inner.finished.get(&key) {
                None => (RunState::Unknown, None),
                Some(Kept { answer: None, .. }) => (RunState::Forgotten, None),
                Some(Kept {
                    answer: Some(answer),
                    ..
                }) => (RunState::Finished, Some(answer.clone())),
            }
        };
        let (result, error) = match answer {
            None => (None, None),
            Some(Ok(r)) => (Some(Box::new(r)), None),
            Some(Err(e)) => (None, Some(e.into())),
        };
        ExecutorRunStatus {
            state,
            result,
            error,
        }
    }

    /// (records, bytes of kept answers): the heartbeat's gauges.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.finished.len(), inner.bytes)
    }
}

fn forgotten(key: &Key) -> ExecutorError {
    ExecutorError::Forgotten {
        execution_id: key.execution_id.clone(),
    }
}

/// About what an answer costs in memory: its texts and outputs (the rest is small and fixed).
fn answer_bytes(answer: &Answer) -> usize {
    const FIXED: usize = 512;
    FIXED
        + match answer {
            Ok(r) => {
                r.stdout.len()
                    + r.stderr.len()
                    + r.outputs
                        .iter()
                        .map(|o| o.content.as_ref().map_or(0, String::len) + o.mime_type.len())
                        .sum::<usize>()
                    + r.files_created
                        .iter()
                        .chain(&r.files_modified)
                        .map(String::len)
                        .sum::<usize>()
            }
            Err(e) => e.to_string().len(),
        }
}

impl Inner {
    fn keep(&mut self, key: Key, answer: Answer, limits: &KeepLimits) {
        let bytes = answer_bytes(&answer);
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(old) = self.finished.remove(&key) {
            self.bytes -= old.bytes;
        }
        // An answer larger than the whole budget is not kept: the record says it ran.
        let (answer, bytes) = if bytes > limits.max_bytes {
            (None, 0)
        } else {
            (Some(answer), bytes)
        };
        self.bytes += bytes;
        if answer.is_some() {
            self.answered.push_back((key.clone(), seq));
        }
        self.finished
            .insert(key.clone(), Kept { answer, bytes, seq });
        self.order.push_back((key, seq, Instant::now()));
        self.bound(limits);
    }

    /// Forgets answers, oldest first, until the bytes fit; drops records, oldest first, until
    /// their count does.
    fn bound(&mut self, limits: &KeepLimits) {
        while self.bytes > limits.max_bytes {
            let Some((key, seq)) = self.answered.pop_front() else {
                break;
            };
            if let Some(kept) = self.finished.get_mut(&key).filter(|k| k.seq == seq) {
                self.bytes -= kept.bytes;
                kept.bytes = 0;
                kept.answer = None;
            }
        }
        while self.finished.len() > limits.max_entries {
            self.pop_oldest();
        }
        // Entries of records replaced or dropped since would otherwise pile up.
        let stale = 2 * limits.max_entries.max(1);
        while self.order.len() > stale {
            self.pop_oldest();
        }
        while self.answered.len() > stale {
            self.answered.pop_front();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((key, seq, _)) = self.order.pop_front() {
            if self.finished.get(&key).is_some_and(|k| k.seq == seq) {
                let kept = self.finished.remove(&key).expect("present");
                self.bytes -= kept.bytes;
            }
        }
    }

    /// Drops every record that ended `keep` ago or more.
    fn expire(&mut self, keep: Duration) {
        let now = Instant::now();
        while self
            .order
            .front()
            .is_some_and(|(_, _, at)| now.duration_since(*at) >= keep)
        {
            self.pop_oldest();
        }
    }
}

#[cfg(test)]
mod tests {
    use messages::exec::ExecStatus;
    use messages::executor::RunKind;
    use messages::validate::ValidationError;
    use messages::ErrorBody;
    use ractor::concurrency::{oneshot, OneshotReceiver};

    use super::*;

    fn run(tenant: Option<&str>, id: &str) -> ExecutorRun {
        let mut run = ExecutorRun::new(id.into(), Default::default(), RunKind::Pooled).unwrap();
        run.tenant = tenant.map(|t| Tenant::new(t).unwrap());
        run
    }

    fn ok(stdout: &str) -> Answer {
        Ok(ExecResult {
            status: ExecStatus::Ok,
            stdout: stdout.into(),
            ..Default::default()
        })
    }

    fn port() -> (Reply, OneshotReceiver<Answer>) {
        let (tx, rx) = oneshot();
        (tx.into(), rx)
    }

    fn state(store: &ResultStore, run: &ExecutorRun) -> RunState {
        store.status(&ExecutorStatusQuery::of(run)).state
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_is_attached_to_while_it_goes_then_answered_again_until_its_keep_time() {
        let store = ResultStore::new(KeepLimits {
            keep: Duration::from_secs(60),
            ..Default::default()
        });
        let r = run(Some("acme"), "acme-x1");
        assert_eq!(state(&store, &r), RunState::Unknown);
        let (first, _first_rx) = port();
        let Err(first) = store.seen(&r, first) else {
            panic!("an unknown run is to be run");
        };
        drop(first);
        store.started(&r);
        assert_eq!(state(&store, &r), RunState::Running);
        let (second, mut second_rx) = port();
        assert!(matches!(store.seen(&r, second), Ok(Seen::Attached)));
        let waiters = store.finished(&r, &ok("hi\n"));
        assert_eq!(waiters.len(), 1, "the attached caller is handed back");
        for w in waiters {
            assert!(w.send(ok("hi\n")).is_ok());
        }
        assert_eq!(second_rx.try_recv().unwrap().unwrap().stdout, "hi\n");

        let status = store.status(&ExecutorStatusQuery::of(&r));
        assert_eq!(status.state, RunState::Finished);
        assert_eq!(status.result.unwrap().stdout, "hi\n");
        tokio::time::advance(Duration::from_secs(59)).await;
        let (third, _rx) = port();
        let Ok(Seen::Answered(_, again)) = store.seen(&r, third) else {
            panic!("a finished run is answered from the store");
        };
        assert_eq!(again.expect("the kept result").stdout, "hi\n");
        // Another tenant's execution of the same client id is not this one.
        let other = run(Some("beta"), "acme-x1");
        assert_eq!(state(&store, &other), RunState::Unknown);
        assert_eq!(state(&store, &run(None, "acme-x1")), RunState::Unknown);

        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(state(&store, &r), RunState::Unknown, "expired");
        assert_eq!(store.usage(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_ran_for_a_transient_error_so_it_is_not_kept_but_a_final_error_is() {
        let store = ResultStore::default();
        let (busy, fail) = (run(None, "busy"), run(None, "fail"));
        for r in [&busy, &fail] {
            store.started(r);
        }
        store.finished(&busy, &Err(ExecutorError::Full { capacity: 1 }));
        let broke = ValidationError::invalid("code", "broke");
        store.finished(&fail, &Err(broke.clone().into()));
        assert_eq!(state(&store, &busy), RunState::Unknown);
        let status = store.status(&ExecutorStatusQuery::of(&fail));
        assert_eq!(status.state, RunState::Finished);
        assert_eq!(
            status.error,
            Some(ErrorBody::from(broke)),
            "given as its wire form, details and all"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_forget_the_oldest_answers_and_the_count_drops_the_oldest_records() {
        let store = ResultStore::new(KeepLimits {
            keep: Duration::from_secs(600),
            max_entries: 3,
            max_bytes: 3 * 1024,
        });
        let big = "x".repeat(1024);
        let runs: Vec<ExecutorRun> = (0..4).map(|i| run(None, &format!("r{i}"))).collect();
        for r in &runs[..3] {
            store.started(r);
            store.finished(r, &ok(&big));
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // Three answers of 1 KiB + 512 each: the first was forgotten to make room.
        assert_eq!(state(&store, &runs[0]), RunState::Forgotten);
        assert_eq!(state(&store, &runs[1]), RunState::Finished);
        let (reply, _rx) = port();
        let Ok(Seen::Answered(_, answer)) = store.seen(&runs[0], reply) else {
            panic!("a forgotten run is not run again");
        };
        assert_eq!(answer.map(|_| ()).unwrap_err().kind(), ErrorKind::Conflict);
        let (records, bytes) = store.usage();
        assert_eq!(records, 3);
        assert!(bytes <= 3 * 1024, "{bytes}");
        // A fourth record: the count drops the oldest entirely.
        store.started(&runs[3]);
        store.finished(&runs[3], &ok("small"));
        assert_eq!(state(&store, &runs[0]), RunState::Unknown);
        assert_eq!(state(&store, &runs[3]), RunState::Finished);
        assert_eq!(store.usage().0, 3);
        // An answer larger than the whole budget leaves only the record.
        let huge = run(None, "huge");
        store.started(&huge);
        store.finished(&huge, &ok(&"y".repeat(4 * 1024)));
        assert_eq!(state(&store, &huge), RunState::Forgotten);
        assert!(store.usage().1 <= 3 * 1024);
    }
}
