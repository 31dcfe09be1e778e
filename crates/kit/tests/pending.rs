//! A service waiting for its image (`sandmesh up` builds the browser and AIO images in the
//! background): its subject answers `unavailable` with what it waits for and for how long,
//! then the service gets what was built; a failed build is said, and the service keeps
//! answering until stopped. Over a real nats-server, as a raw client would ask.

use std::time::Duration;

use kit::pending::{serve_while, Pending};
use kit::{CancellationToken, KitConfig, ServiceInfo};
use messages::codec::SERVICE_ERROR_CODE;
use messages::{ErrorBody, ErrorKind};
use test_support::NatsServer;
use tokio::sync::oneshot;

const SUBJECT: &str = "kit.test.pending";

fn info() -> ServiceInfo {
    ServiceInfo {
        name: "browser-router".into(),
        version: "0.1.0".into(),
        description: "waits for its image".into(),
    }
}

/// What a request on [`SUBJECT`] gets back: the error code header and body.
async fn ask(client: &async_nats::Client) -> (u16, ErrorBody) {
    let reply = client
        .request(SUBJECT, r#"{"url":"https://example.org"}"#.into())
        .await
        .expect("an answer, not `no responders`");
    let code = reply
        .headers
        .as_ref()
        .and_then(|h| h.get(SERVICE_ERROR_CODE))
        .expect("an error reply")
        .as_str()
        .parse()
        .unwrap();
    (code, serde_json::from_slice(&reply.payload).unwrap())
}

/// Asks until the endpoint is there (`serve_while` runs on its own task).
async fn ask_when_served(client: &async_nats::Client) -> (u16, ErrorBody) {
    for _ in 0..100 {
        if let Ok(Ok(reply)) =
            tokio::time::timeout(Duration::from_secs(1), client.request(SUBJECT, "{}".into())).await
        {
            drop(reply);
            return ask(client).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{SUBJECT} never answered");
}

#[tokio::test]
async fn a_service_answers_still_building_until_its_image_is_built() {
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let (done, built) = oneshot::channel::<String>();
    let pending = Pending::spawn("the browser image", async move {
        Ok(built.await.expect("the test sends the image"))
    });
    let shutdown = CancellationToken::new();
    let config = KitConfig::for_url(&nats.url());
    let waiting = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { serve_while(&config, &info(), vec![SUBJECT.into()], pending, &shutdown).await }
    });

    let (code, body) = ask_when_served(&client).await;
    assert_eq!(code, 503);
    assert_eq!(body.kind, ErrorKind::Unavailable);
    assert!(
        body.message
            .starts_with("the browser image is still building (")
            && body.message.contains(" s so far)"),
        "{}",
        body.message
    );

    done.send("sandmesh/browser:0123456789ab".into()).unwrap();
    let image = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("serve_while returns once the image is built")
        .unwrap()
        .unwrap();
    assert_eq!(image.as_deref(), Some("sandmesh/browser:0123456789ab"));
    // Its endpoint is gone, so the real service is the only one answering from now on.
    let after = client.request(SUBJECT, "{}".into()).await;
    assert!(after.is_err(), "the placeholder still answers: {after:?}");
}

#[tokio::test]
async fn a_failed_build_is_said_and_answered_until_the_mesh_stops() {
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let pending = Pending::spawn("the AIO image", async {
        Err("apt-get install chromium: exit status 100".to_string())
    });
    let shutdown = CancellationToken::new();
    let config = KitConfig::for_url(&nats.url());
    let waiting = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { serve_while(&config, &info(), vec![SUBJECT.into()], pending, &shutdown).await }
    });

    let (code, body) = ask_when_served(&client).await;
    assert_eq!(code, 503);
    assert!(
        body.message
            .contains("the AIO image could not be built: apt-get install chromium"),
        "{}",
        body.message
    );
    assert!(
        !waiting.is_finished(),
        "a failed build must not stop the service"
    );

    shutdown.cancel();
    let image = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("serve_while returns when the mesh stops")
        .unwrap()
        .unwrap();
    assert_eq!(image, None);
}
