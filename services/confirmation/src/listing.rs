//! `confirm.list`: pending confirmations from the registry's replica (cheap, and the common
//! case: a person's queue), decided ones by scanning the bucket (rarer: history).

use std::collections::HashMap;
use std::time::Duration;

use messages::confirm::{ConfirmList, ConfirmListReply, ConfirmState, Confirmation};
use messages::validate::ValidationError;
use tokio::time::Instant;

use crate::audience::Audience;
use crate::error::Reply;
use crate::store::{ConfirmationStore, StoreError};

pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1000;
/// How long a pending `list` waits for the replica to catch up with the bucket before it is
/// answered anyway.
pub const BARRIER: Duration = Duration::from_secs(2);

pub fn check(list: &ConfirmList) -> Result<(), ValidationError> {
    if let Some(session) = &list.session_id {
        crate::validate::id("session_id", session)?;
    }
    if let Some(limit) = list.limit {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ValidationError::invalid(
                "limit",
                format!("must be 1..={MAX_LIMIT} (got {limit})"),
            ));
        }
    }
    Ok(())
}

pub fn wants_pending(list: &ConfirmList) -> bool {
    matches!(list.state, None | Some(ConfirmState::Pending))
}

fn limit(list: &ConfirmList) -> usize {
    list.limit.unwrap_or(DEFAULT_LIMIT) as usize
}

/// A `list` as one caller asked it: only what its audience may see.
#[derive(Debug, Clone)]
pub struct Query {
    pub list: ConfirmList,
    pub audience: Audience,
}

impl Query {
    fn admits(&self, c: &Confirmation) -> bool {
        (self.list.session_id.is_none() || c.session_id == self.list.session_id)
            && self.audience.sees(c)
    }
}

/// The pending ones matching `list`, newest first.
pub fn from_replica(pending: &HashMap<String, Confirmation>, query: &Query) -> ConfirmListReply {
    let mut confirmations: Vec<Confirmation> = pending
        .values()
        .filter(|c| query.admits(c))
        .cloned()
        .collect();
    confirmations.sort_unstable_by(|a, b| b.id.cmp(&a.id));
    confirmations.truncate(limit(&query.list));
    ConfirmListReply { confirmations }
}

/// Decided ones matching `list`, newest first, read from the bucket.
pub async fn scan(
    store: &ConfirmationStore,
    query: &Query,
) -> Result<ConfirmListReply, StoreError> {
    let keep = |c: &Confirmation| Some(c.state) == query.list.state && query.admits(c);
    let confirmations = store.scan(keep, limit(&query.list)).await?;
    Ok(ConfirmListReply { confirmations })
}

/// Pending `list`s parked until the replica has applied the bucket revision they were asked
/// at (or their [`BARRIER`] is over).
#[derive(Default)]
pub struct ParkedLists(Vec<Parked>);

struct Parked {
    query: Query,
    revision: u64,
    deadline: Instant,
    port: Reply<ConfirmListReply>,
}

impl ParkedLists {
    pub fn park(&mut self, query: Query, revision: u64, port: Reply<ConfirmListReply>) {
        self.0.push(Parked {
            query,
            revision,
            deadline: Instant::now() + BARRIER,
            port,
        });
    }

    /// Answers the lists the replica has caught up with.
    pub fn release_applied(&mut self, applied: u64, pending: &HashMap<String, Confirmation>) {
        for parked in self.take(|p| p.revision <= applied) {
            let _ = parked.port.send(Ok(from_replica(pending, &parked.query)));
        }
    }

    /// Answers the lists whose barrier is over, from the replica as it is.
    pub fn release_due(&mut self, applied: u64, pending: &HashMap<String, Confirmation>) {
        let now = Instant::now();
        for parked in self.take(|p| p.deadline <= now) {
            tracing::warn!(
                revision = parked.revision,
                applied,
                "list answered from a lagging replica"
            );
            let _ = parked.port.send(Ok(from_replica(pending, &parked.query)));
        }
    }

    fn take(&mut self, done: impl Fn(&Parked) -> bool) -> Vec<Parked> {
        let (done, keep) = std::mem::take(&mut self.0).into_iter().partition(done);
        self.0 = keep;
        done
    }
}
