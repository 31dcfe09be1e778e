//! `confirm.list`: pending confirmations from the registry's replica (cheap, and the common
//! case: a person's queue), decided ones by scanning the bucket (rarer: history).

use std::collections::HashMap;

use messages::confirm::{ConfirmList, ConfirmListReply, ConfirmState, Confirmation};
use messages::ErrorBody;

use crate::store::ConfirmationStore;

pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1000;

pub fn check(list: &ConfirmList) -> Result<(), ErrorBody> {
    if let Some(session) = &list.session_id {
        crate::validate::id("session_id", session)?;
    }
    if let Some(limit) = list.limit {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ErrorBody::bad_request(format!(
                "limit: must be 1..={MAX_LIMIT} (got {limit})"
            )));
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

fn in_session(list: &ConfirmList, c: &Confirmation) -> bool {
    list.session_id.is_none() || c.session_id == list.session_id
}

/// The pending ones matching `list`, newest first.
pub fn from_replica(
    pending: &HashMap<String, Confirmation>,
    list: &ConfirmList,
) -> ConfirmListReply {
    let mut confirmations: Vec<Confirmation> = pending
        .values()
        .filter(|c| in_session(list, c))
        .cloned()
        .collect();
    confirmations.sort_unstable_by(|a, b| b.id.cmp(&a.id));
    confirmations.truncate(limit(list));
    ConfirmListReply { confirmations }
}

/// Decided ones matching `list`, newest first, read from the bucket.
pub async fn scan(
    store: &ConfirmationStore,
    list: &ConfirmList,
) -> Result<ConfirmListReply, ErrorBody> {
    let keep = |c: &Confirmation| Some(c.state) == list.state && in_session(list, c);
    let confirmations = store.scan(keep, limit(list)).await?;
    Ok(ConfirmListReply { confirmations })
}
