//! A service that cannot serve yet because something it needs is still being made — `sandmesh
//! up` builds the browser and AIO images in the background so that `exec` is served minutes
//! earlier. Meanwhile the service's subjects answer `unavailable`, saying what it waits for and
//! for how long, instead of leaving callers with "no responders" (or a mesh that serves
//! nothing until the slowest image exists).

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use messages::ErrorBody;
use serde::de::IgnoredAny;
use tokio_util::sync::CancellationToken;

use crate::serve::{handler, ServiceInfo};
use crate::{KitConfig, KitError, Runtime};

/// Something being made on the side (an image build): what it is, since when, and its
/// outcome — the value the service needs (an image reference) or why it could not be made.
/// Clones share the one piece of work.
#[derive(Clone)]
pub struct Pending {
    what: String,
    since: Instant,
    outcome: Shared<BoxFuture<'static, Result<String, String>>>,
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("what", &self.what)
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

impl Pending {
    /// Starts `work` on its own task (it goes on whether or not anyone waits for it yet).
    /// `what` names it in messages: "the browser image".
    pub fn spawn(
        what: impl Into<String>,
        work: impl Future<Output = Result<String, String>> + Send + 'static,
    ) -> Self {
        let task = tokio::spawn(work);
        let outcome = async move {
            task.await
                .unwrap_or_else(|e| Err(format!("the build task failed: {e}")))
        }
        .boxed()
        .shared();
        Self {
            what: what.into(),
            since: Instant::now(),
            outcome,
        }
    }

    /// What it made, if it is done within `limit` (an image that is up to date is found in
    /// about a second: a service that would wait for it then starts as usual).
    pub async fn made_within(&self, limit: Duration) -> Option<String> {
        match tokio::time::timeout(limit, self.outcome.clone()).await {
            Ok(Ok(made)) => Some(made),
            _ => None,
        }
    }

    /// The answer to a request while it is not done (or after it failed).
    fn unavailable(&self) -> ErrorBody {
        match self.outcome.peek() {
            Some(Err(why)) => ErrorBody::unavailable(format!(
                "{} could not be built: {why}; see the mesh's log, fix it and restart",
                self.what
            )),
            _ => ErrorBody::unavailable(format!(
                "{} is still building ({} s so far); try again when it is done",
                self.what,
                self.since.elapsed().as_secs()
            )),
        }
        .with_details(serde_json::json!({ "retry_after_ms": RETRY_AFTER.as_millis() as u64 }))
    }
}

/// What callers are told to wait before they ask again.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// Serves `subjects` as `info`'s service, every request answered `unavailable`, until
/// `pending` is done: returns what it made. When it failed, goes on answering (with why) until
/// `shutdown`, so the rest of the mesh keeps serving; `None` when `shutdown` came first.
pub async fn serve_while(
    config: &KitConfig,
    info: &ServiceInfo,
    subjects: Vec<String>,
    pending: Pending,
    shutdown: &CancellationToken,
) -> Result<Option<String>, KitError> {
    if let Some(Ok(made)) = pending.outcome.peek() {
        return Ok(Some(made.clone()));
    }
    let runtime = Runtime::start(config.clone(), info.clone()).await?;
    for subject in subjects {
        let pending = pending.clone();
        let answer = handler(move |_, _: IgnoredAny| {
            let error = pending.unavailable();
            async move { Err::<(), _>(error) }
        });
        runtime.serve(subject, answer).await?;
    }
    tracing::info!(service = %info.name, waiting_for = %pending.what, "serving `unavailable` until it is built");
    let made = tokio::select! {
        outcome = pending.outcome.clone() => outcome,
        _ = shutdown.cancelled() => Err(String::new()),
    };
    let made = match made {
        Ok(made) => Some(made),
        Err(_) if shutdown.is_cancelled() => None,
        Err(why) => {
            tracing::error!(service = %info.name, what = %pending.what, error = %why, "cannot be built; answering `unavailable` until stopped");
            shutdown.cancelled().await;
            None
        }
    };
    // The real service registers next: this one's endpoints are gone before it does.
    runtime.shutdown().await;
    Ok(made)
}
