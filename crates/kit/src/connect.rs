//! Connecting to NATS (one server, or several comma-separated: a cluster): retry while the
//! server is not up yet, reconnect to any server of the list, and log every connection event
//! (a slow-consumer event means a subscriber dropped messages: the read loop is too slow).

use std::time::Duration;

use async_nats::{Client, ConnectOptions, Event};

use crate::config::KitConfig;
use crate::KitError;

/// How long one NATS request may take before the caller sees a timeout, unless overridden.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects service `service` (instance `name`). Its inboxes are `_INBOX_<service>.…`, the
/// only ones its NATS user may read, so no service sees another's replies.
pub async fn connect(config: &KitConfig, service: &str, name: &str) -> Result<Client, KitError> {
    let mut options = ConnectOptions::new()
        .name(name)
        .custom_inbox_prefix(inbox_prefix(service))
        .retry_on_initial_connect()
        .request_timeout(Some(DEFAULT_REQUEST_TIMEOUT))
        .event_callback(|event| async move {
            match event {
                Event::Connected => tracing::info!("nats connected"),
                Event::Disconnected => tracing::warn!("nats disconnected; reconnecting"),
                Event::LameDuckMode => tracing::warn!("nats server entered lame duck mode"),
                Event::SlowConsumer(sid) => {
                    tracing::error!(sid, "nats slow consumer: messages were dropped")
                }
                Event::ServerError(e) => tracing::error!(error = %e, "nats server error"),
                Event::ClientError(e) => tracing::error!(error = %e, "nats client error"),
                other => tracing::debug!(event = %other, "nats event"),
            }
        });
    // Credentials in the URL (`sandmesh creds` prints them so) win over the separate settings,
    // and those over the tenancy file.
    let (url, in_url) = sandmesh_auth::split_url(&config.nats_url);
    let credentials = match (in_url, &config.nats_user, &config.nats_password) {
        (Some(c), _, _) => Some(c),
        (None, Some(user), Some(password)) => Some(sandmesh_auth::Credentials {
            user: user.clone(),
            password: password.clone(),
        }),
        _ => from_tenancy_file(config, service)?,
    };
    if let Some(c) = credentials {
        options = options.user_and_password(c.user, c.password);
    }
    // Several servers (a cluster): the client picks one and fails over to the others, and to
    // those the cluster announces.
    let client = options
        .connect(sandmesh_auth::servers(&url))
        .await
        .map_err(|source| KitError::Connect {
            url: url.clone(),
            source,
        })?;
    Ok(client)
}

/// This service's own credentials from the tenancy file, when one is configured.
fn from_tenancy_file(
    config: &KitConfig,
    service: &str,
) -> Result<Option<sandmesh_auth::Credentials>, KitError> {
    let Some(path) = &config.tenancy_file else {
        return Ok(None);
    };
    let tenancy = sandmesh_auth::Tenancy::load(path)?;
    let missing = || KitError::NoCredentials {
        file: path.display().to_string(),
        service: service.to_string(),
    };
    let name: messages::ServiceName = service.parse().map_err(|_| missing())?;
    tenancy
        .credentials(sandmesh_auth::Role::Service(name))
        .cloned()
        .map(Some)
        .ok_or_else(missing)
}

/// `_INBOX_<service>`: the inbox prefix of a service's connections.
pub fn inbox_prefix(service: &str) -> String {
    format!("_INBOX_{service}")
}

/// Waits until the server has processed everything this client sent before the call, so
/// subscriptions made earlier are live for every other client. `flush` alone only writes the
/// socket; the server may not have registered a SUB yet when another client publishes, which
/// shows up as a spurious "no responders". A message to our own inbox comes back only after
/// the server has handled all earlier protocol lines of this connection, in order.
pub async fn sync_with_server(client: &Client) -> Result<(), KitError> {
    use futures::StreamExt;
    let inbox = client.new_inbox();
    let failed = |e: crate::BoxError| KitError::nats("syncing with server", e);
    let mut echo = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| failed(e.into()))?;
    client
        .publish(inbox, bytes::Bytes::new())
        .await
        .map_err(|e| failed(e.into()))?;
    let outcome = tokio::time::timeout(DEFAULT_REQUEST_TIMEOUT, echo.next()).await;
    let _ = echo.unsubscribe().await;
    match outcome {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(failed("connection closed".into())),
        Err(_) => Err(failed("no echo from the server".into())),
    }
}
