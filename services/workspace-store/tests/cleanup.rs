//! TTL sweep, explicit cleanup, and the audit trail of workspace changes.

use std::time::Duration;

use crate::common::*;
use async_nats::jetstream;
use messages::audit::{AuditDetails, AuditEvent, CleanReason, WorkspaceCleaned};
use messages::Subjects;
use sandmesh_client::ErrorKind;
use test_support::{eventually, eventually_true, NatsServer};
use workspace_store::index::SessionMeta;

/// Makes a session look untouched for `hours` (as if its last write were that long ago).
async fn backdate(js: &jetstream::Context, session: &str, hours: u64) {
    let kv = js
        .get_key_value(Subjects::default().workspace_index_bucket())
        .await
        .unwrap();
    let key = workspace_store::keys::meta_key(session);
    let mut meta: SessionMeta =
        serde_json::from_slice(&kv.get(&key).await.unwrap().unwrap()).unwrap();
    meta.last_modified -= hours * 3600 * 1000;
    kv.put(&key, serde_json::to_vec(&meta).unwrap().into())
        .await
        .unwrap();
}

/// The last audit event of `kind` for `session`, if stored yet.
async fn audit_event(js: &jetstream::Context, kind: &str, session: &str) -> Option<AuditEvent> {
    let s = Subjects::default();
    let stream = js.get_stream(s.audit_stream()).await.ok()?;
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            filter_subject: s.audit_kind(kind),
            ..Default::default()
        })
        .await
        .ok()?;
    use futures::StreamExt;
    let mut batch = consumer.fetch().max_messages(1000).messages().await.ok()?;
    let mut found = None;
    while let Some(Ok(m)) = batch.next().await {
        let event: AuditEvent = serde_json::from_slice(&m.payload).ok()?;
        if event.session_id.as_deref() == Some(session) {
            found = Some(event);
        }
    }
    found
}

#[tokio::test]
async fn idle_workspaces_are_swept_and_active_ones_kept() {
    let nats = NatsServer::start();
    let url = nats.url();
    let mut cfg = config(&url, "sweep");
    cfg.sweep_interval = Duration::from_millis(200);
    let _svc = start(cfg).await;
    let ws = client(&url).await;
    let js = jetstream::new(crate::common::nats(&url).await);
    for s in ["idle", "busy"] {
        ws.init(s).await.unwrap();
        ws.write(s, "data/x.bin", &bytes(5000, 1)).await.unwrap();
    }
    backdate(&js, "idle", 25).await;

    eventually_true("the idle workspace swept", TIMEOUT, || async {
        ws.usage("idle").await.unwrap().last_modified == 0
    })
    .await;
    assert_eq!(
        ws.read("idle", "data/x.bin").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(ws.read("busy", "data/x.bin").await.unwrap().len(), 5000);
    // Its contents are gone from the object store too.
    let (objects, _) = store_state(&url, &[]).await;
    assert!(
        objects.iter().all(|o| !o.starts_with("ws/idle/")),
        "{objects:?}"
    );
    assert!(objects.iter().any(|o| o.starts_with("ws/busy/")));

    let event = audit_event(&js, "workspace_cleaned", "idle").await.unwrap();
    assert!(
        matches!(
            event.details,
            AuditDetails::WorkspaceCleaned(WorkspaceCleaned {
                reason: CleanReason::Ttl,
                ..
            })
        ),
        "{event:?}"
    );
}

#[tokio::test]
async fn cleanup_on_request_and_audit_of_changes() {
    let nats = NatsServer::start();
    let url = nats.url();
    let _svc = start(config(&url, "clean")).await;
    let ws = client(&url).await;
    let js = jetstream::new(crate::common::nats(&url).await);
    ws.init("s").await.unwrap();
    ws.write("s", "code/a.py", b"a").await.unwrap();
    ws.delete("s", "code/a.py", false).await.unwrap();
    let tar = RawTar::default().file("out/r.txt", b"r").finish();
    ws.restore("s", &tar, false, Vec::new()).await.unwrap();

    let cleaned = ws.cleanup(Some("s")).await.unwrap();
    assert_eq!(cleaned.sessions_removed, ["s"]);
    // Gone: a 404 like any workspace that does not exist.
    assert_eq!(
        ws.list("s", None, true).await.unwrap_err().kind(),
        sandmesh_client::ErrorKind::NotFound
    );
    assert_eq!(ws.usage("s").await.unwrap().bytes, 0);
    assert!(ws
        .cleanup(Some("s"))
        .await
        .unwrap()
        .sessions_removed
        .is_empty());
    let (objects, _) = store_state(&url, &[]).await;
    assert!(objects.is_empty(), "{objects:?}");

    for kind in [
        "file_written",
        "file_deleted",
        "workspace_restored",
        "workspace_cleaned",
    ] {
        let event = eventually(&format!("a {kind} event"), TIMEOUT, || async {
            audit_event(&js, kind, "s").await
        })
        .await;
        match &event.details {
            AuditDetails::FileWritten(d) => assert_eq!((d.path.as_str(), d.size), ("code/a.py", 1)),
            AuditDetails::FileDeleted(d) => {
                assert_eq!((d.path.as_str(), d.files), ("code/a.py", 1))
            }
            AuditDetails::WorkspaceRestored(d) => assert_eq!((d.created, d.replace), (1, false)),
            AuditDetails::WorkspaceCleaned(d) => assert_eq!(d.reason, CleanReason::Request),
            other => panic!("{kind}: {other:?}"),
        }
    }
}
