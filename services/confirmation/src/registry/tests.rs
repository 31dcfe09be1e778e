//! The registry's timers on paused tokio time, over the in-memory `Book`: a minute of expiry
//! takes microseconds, and "not yet" is checked a moment before the deadline.

use std::time::Duration;

use messages::confirm::{ConfirmDecide, ConfirmGet, ConfirmScope, ConfirmState};
use messages::ErrorKind;
use ractor::{call_t, Actor, ActorRef};
use tokio::task::JoinHandle;
use tokio::time::sleep;

use super::*;
use crate::store::StoreError;
use crate::testing::{ctx, request, Book};

/// Bounds every call; on paused time a call that never returns fails here instead of hanging.
const CALL_MS: u64 = 3_600_000;
const MINUTE: Duration = Duration::from_secs(60);

async fn start(book: &Book) -> (ActorRef<RegistryMsg>, Arc<Gauges>) {
    let gauges = Arc::new(Gauges::default());
    let args = RegistryArgs {
        workflow: book.clone(),
        gauges: gauges.clone(),
    };
    let (registry, _) = Actor::spawn(None, Registry::<Book>::default(), args)
        .await
        .unwrap();
    (registry, gauges)
}

async fn open(registry: &ActorRef<RegistryMsg>, timeout: Duration) -> Confirmation {
    call_t!(
        registry,
        RegistryMsg::Request,
        CALL_MS,
        ctx(),
        request(false, timeout)
    )
    .unwrap()
    .unwrap()
}

/// Asks with `wait` in the background; the reply comes with the decision.
fn ask_waiting(
    registry: &ActorRef<RegistryMsg>,
    req: ConfirmRequest,
) -> JoinHandle<Result<Confirmation, ConfirmError>> {
    let registry = registry.clone();
    tokio::spawn(
        async move { call_t!(registry, RegistryMsg::Request, CALL_MS, ctx(), req).unwrap() },
    )
}

fn approval(id: &str) -> ConfirmDecide {
    ConfirmDecide {
        by_account: None,
        id: id.into(),
        approve: true,
        by: "alice".into(),
        reason: None,
        scope: ConfirmScope::Once,
    }
}

#[tokio::test(start_paused = true)]
async fn a_pending_confirmation_times_out_at_its_expiry_with_nobody_waiting() {
    let book = Book::new();
    let (registry, gauges) = start(&book).await;
    let pending = open(&registry, MINUTE).await;
    assert_eq!(pending.state, ConfirmState::Pending);

    sleep(MINUTE - Duration::from_millis(10)).await;
    assert_eq!(book.state(&pending.id), Some(ConfirmState::Pending));
    assert_eq!(gauges.pending.load(Ordering::Relaxed), 1);

    sleep(Duration::from_millis(20)).await;
    assert_eq!(book.state(&pending.id), Some(ConfirmState::Timeout));
    assert_eq!(gauges.pending.load(Ordering::Relaxed), 0);
    let got = call_t!(
        registry,
        RegistryMsg::Get,
        CALL_MS,
        ctx(),
        ConfirmGet { id: pending.id }
    )
    .unwrap()
    .unwrap();
    assert_eq!(got.state, ConfirmState::Timeout);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_answered_with_the_timeout_when_nobody_decides() {
    let book = Book::new();
    let (registry, gauges) = start(&book).await;
    let waiting = ask_waiting(&registry, request(true, MINUTE));

    sleep(MINUTE - Duration::from_millis(10)).await;
    assert!(!waiting.is_finished());
    assert_eq!(gauges.waiters.load(Ordering::Relaxed), 1);

    sleep(Duration::from_millis(20)).await;
    let answered = waiting.await.unwrap().unwrap();
    assert_eq!(answered.state, ConfirmState::Timeout);
    assert_eq!(gauges.waiters.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_decision_releases_every_waiter_of_that_confirmation() {
    let book = Book::new();
    let (registry, _) = start(&book).await;
    let req = request(true, MINUTE);
    let first = ask_waiting(&registry, req.clone());
    let second = ask_waiting(&registry, req);
    sleep(Duration::from_secs(1)).await;
    let id = the_only_pending_id(&registry).await;

    let decided = call_t!(registry, RegistryMsg::Decide, CALL_MS, ctx(), approval(&id))
        .unwrap()
        .unwrap();
    assert_eq!(decided.state, ConfirmState::Approved);
    assert_eq!(first.await.unwrap().unwrap(), decided);
    assert_eq!(second.await.unwrap().unwrap(), decided);
}

/// The id of the one pending confirmation, as `list` shows it.
async fn the_only_pending_id(registry: &ActorRef<RegistryMsg>) -> String {
    let listed = call_t!(
        registry,
        RegistryMsg::List,
        CALL_MS,
        ctx(),
        ConfirmList::default()
    )
    .unwrap()
    .unwrap();
    assert_eq!(listed.confirmations.len(), 1);
    listed.confirmations[0].id.clone()
}

#[tokio::test(start_paused = true)]
async fn an_unrecordable_timeout_is_retried_and_its_waiters_get_a_retryable_error_after_the_grace()
{
    let book = Book::new();
    book.set_unavailable(true);
    let (registry, gauges) = start(&book).await;
    let waiting = ask_waiting(&registry, request(true, MINUTE));

    sleep(MINUTE + WAITER_GRACE - Duration::from_millis(10)).await;
    assert!(!waiting.is_finished(), "answered before expiry + grace");
    let attempts = book.expire_calls();
    assert!(
        attempts >= (WAITER_GRACE.as_secs() / EXPIRE_RETRY.as_secs()) as usize,
        "the timeout write is retried every {EXPIRE_RETRY:?}: {attempts} attempts"
    );

    sleep(Duration::from_millis(20)).await;
    let error = waiting.await.unwrap().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error:?}");
    // The waiter learns why: the bucket's outage, with its own cause underneath.
    let ConfirmError::Shared(why) = &error else {
        panic!("not the expiry's failure: {error:?}");
    };
    assert!(
        matches!(&**why, ConfirmError::Store(StoreError::Unavailable { .. })),
        "{why:?}"
    );
    let cause = std::error::Error::source(&error).expect("the outage's cause is kept");
    assert_eq!(cause.to_string(), "the bucket is unreachable");
    assert_eq!(gauges.waiters.load(Ordering::Relaxed), 0);

    // Once the bucket is back, the retries record the timeout.
    book.set_unavailable(false);
    sleep(EXPIRE_RETRY + Duration::from_millis(10)).await;
    assert_eq!(gauges.pending.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_new_registry_rearms_the_expiry_of_confirmations_pending_in_the_bucket() {
    let book = Book::new();
    let (first, _) = start(&book).await;
    let pending = open(&first, MINUTE).await;
    first.stop_and_wait(None, None).await.unwrap();

    sleep(MINUTE / 2).await;
    let (_second, gauges) = start(&book).await;
    sleep(Duration::from_millis(1)).await;
    assert_eq!(gauges.pending.load(Ordering::Relaxed), 1, "state reloaded");
    sleep(MINUTE / 2 - Duration::from_millis(10)).await;
    assert_eq!(book.state(&pending.id), Some(ConfirmState::Pending));
    sleep(Duration::from_millis(20)).await;
    assert_eq!(book.state(&pending.id), Some(ConfirmState::Timeout));
}

#[tokio::test(start_paused = true)]
async fn drain_answers_waiters_with_a_retryable_error_and_refuses_new_waits() {
    let book = Book::new();
    let (registry, gauges) = start(&book).await;
    let held = ask_waiting(&registry, request(true, MINUTE));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(gauges.waiters.load(Ordering::Relaxed), 1);

    call_t!(registry, RegistryMsg::Drain, CALL_MS).unwrap();
    let error = held.await.unwrap().unwrap_err();
    assert!(matches!(error, ConfirmError::Stopping), "{error:?}");
    let refused = ask_waiting(&registry, request(true, MINUTE)).await.unwrap();
    assert!(
        matches!(refused, Err(ConfirmError::Stopping)),
        "{refused:?}"
    );
    // Not waiting is still served: the confirmation is stored and can be got by id.
    assert_eq!(open(&registry, MINUTE).await.state, ConfirmState::Pending);
}
