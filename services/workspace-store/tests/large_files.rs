//! Large files for tenants: chunked `upload`, ranged `read` and `fetch`, under the
//! shipped permissions — a tenant's agent has no JetStream API in the services' account.

use crate::common::{bytes, config, raw, Instance, TIMEOUT};
use messages::subjects::WorkspaceOp;
use messages::workspace::{UploadRef, WsFetch, WsSnapshot, WsUploadAck, WsUploadChunk, WsWrite};
use messages::{ServiceName, Subjects};
use sandmesh_client::{MeshClient, Transfer, WorkspaceClient};
use sha2::{Digest, Sha256};
use test_support::NatsServer;

const MB: usize = 1 << 20;

async fn agent(server: &NatsServer, tenant: &str) -> (async_nats::Client, WorkspaceClient) {
    let nc = crate::common::nats(&server.agent_url(tenant)).await;
    let ws = MeshClient::new(nc.clone(), Subjects::default())
        .with_timeout(TIMEOUT)
        .workspace();
    (nc, ws)
}

/// An instance connected as the workspace-store service user (the shipped permissions),
/// awaited through the admin connection (a service may not call other services' subjects).
async fn store_with(server: &NatsServer, config: workspace_store::WorkspaceConfig) -> Instance {
    let token = kit::CancellationToken::new();
    let task = tokio::spawn(workspace_store::run(config, token.clone()));
    crate::common::wait_ready(&crate::common::client(&server.url()).await).await;
    assert!(!task.is_finished(), "the store stopped: {:?}", task.await);
    Instance { token }
}

async fn store(server: &NatsServer) -> Instance {
    let url = server.service_url(ServiceName::WorkspaceStore);
    store_with(server, config(&url, "ws-large")).await
}

fn subject(op: WorkspaceOp) -> String {
    Subjects::default().workspace(op)
}

fn chunk(session: &str, upload: &str, seq: u64, data: Vec<u8>) -> WsUploadChunk {
    WsUploadChunk {
        session_id: session.into(),
        upload_id: upload.into(),
        seq,
        data,
    }
}

fn write_upload(session: &str, path: &str, upload: UploadRef) -> WsWrite {
    WsWrite {
        session_id: session.into(),
        path: path.into(),
        upload: Some(upload),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_50_mb_file_round_trips_for_a_tenant() {
    let server = NatsServer::start_with_tenants(&["acme", "beta"]);
    let _store = store(&server).await;
    let (_, acme) = agent(&server, "acme").await;
    let data = bytes(50 * MB, 7);
    acme.init("s1").await.unwrap();
    let entry = acme.write("s1", "data/big.bin", &data).await.unwrap();
    assert_eq!(entry.size, data.len() as u64);
    assert_eq!(
        entry.sha256.as_deref(),
        Some(hex::encode(Sha256::digest(&data)).as_str())
    );
    assert!(acme.read("s1", "data/big.bin").await.unwrap() == data);

    let tar = acme.snapshot("s1", None).await.unwrap();
    assert!(tar.len() > data.len());
    acme.init("s2").await.unwrap();
    acme.restore("s2", &tar, true, vec![]).await.unwrap();
    assert!(acme.read("s2", "data/big.bin").await.unwrap() == data);
}

#[tokio::test]
async fn another_tenant_cannot_touch_an_upload_file_or_snapshot() {
    let server = NatsServer::start_with_tenants(&["acme", "beta"]);
    let _store = store(&server).await;
    let (acme_nc, acme) = agent(&server, "acme").await;
    let (beta_nc, _) = agent(&server, "beta").await;
    acme.init("s1").await.unwrap();
    let data = bytes(2 * MB, 3);
    acme.write("s1", "big.bin", &data).await.unwrap();

    let open: WsUploadAck = raw(
        &acme_nc,
        subject(WorkspaceOp::Upload),
        &chunk("s1", "u1", 0, vec![1; 10]),
    )
    .await
    .unwrap();
    assert_eq!(open.seq, 0);
    // beta appends to and commits "u1" of "s1": its own (empty) namespace.
    let e = raw::<_, WsUploadAck>(
        &beta_nc,
        subject(WorkspaceOp::Upload),
        &chunk("s1", "u1", 1, vec![2; 10]),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 404, "{e:?}");
    let commit = UploadRef {
        upload_id: "u1".into(),
        chunks: 1,
        sha256: hex::encode(Sha256::digest([1u8; 10])),
    };
    let e = raw::<_, messages::workspace::WsEntry>(
        &beta_nc,
        subject(WorkspaceOp::Write),
        &write_upload("s1", "x", commit.clone()),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 404, "{e:?}");
    // acme's upload is intact and commits.
    let entry: messages::workspace::WsEntry = raw(
        &acme_nc,
        subject(WorkspaceOp::Write),
        &write_upload("s1", "x", commit),
    )
    .await
    .unwrap();
    assert_eq!(entry.size, 10);

    let read = messages::workspace::WsRead {
        session_id: "s1".into(),
        path: "big.bin".into(),
        offset: Some(0),
        length: Some(1024),
        encoding: None,
    };
    let e = raw::<_, messages::workspace::WsFile>(&beta_nc, subject(WorkspaceOp::Read), &read)
        .await
        .unwrap_err();
    assert_eq!(e.code, 404, "{e:?}");

    let archive: messages::workspace::WsArchive = raw(
        &acme_nc,
        subject(WorkspaceOp::Snapshot),
        &WsSnapshot {
            session_id: "s1".into(),
            prefix: None,
        },
    )
    .await
    .unwrap();
    let object = archive.object.expect("a 2 MB workspace is staged");
    let fetch = WsFetch {
        session_id: "s1".into(),
        object,
        offset: 0,
        length: 1024,
    };
    let e = raw::<_, messages::workspace::WsFile>(&beta_nc, subject(WorkspaceOp::Fetch), &fetch)
        .await
        .unwrap_err();
    assert_eq!(e.code, 404, "{e:?}");
    let own: messages::workspace::WsFile = raw(&acme_nc, subject(WorkspaceOp::Fetch), &fetch)
        .await
        .unwrap();
    assert_eq!(messages::decode_base64(&own.content).unwrap().len(), 1024);
}

#[tokio::test]
async fn an_agent_may_not_name_an_object() {
    let server = NatsServer::start_with_tenants(&["acme"]);
    let _store = store(&server).await;
    let (nc, acme) = agent(&server, "acme").await;
    acme.init("s1").await.unwrap();
    let req = WsWrite {
        session_id: "s1".into(),
        path: "x".into(),
        object: Some("upload/someone-elses".into()),
        ..Default::default()
    };
    let e = raw::<_, messages::workspace::WsEntry>(&nc, subject(WorkspaceOp::Write), &req)
        .await
        .unwrap_err();
    assert_eq!(e.code, 403, "{e:?}");
    // And the agent has no way around it: the objects bucket is not in its account.
    let direct = acme.clone().transfer(Transfer::ObjectStore);
    assert!(direct.write("s1", "y", &bytes(MB, 1)).await.is_err());
    // Nor is it answered with an object name to fetch: a large file is read by ranges.
    acme.write("s1", "big", &bytes(MB, 2)).await.unwrap();
    let whole = messages::workspace::WsRead {
        session_id: "s1".into(),
        path: "big".into(),
        ..Default::default()
    };
    let e = raw::<_, messages::workspace::WsFile>(&nc, subject(WorkspaceOp::Read), &whole)
        .await
        .unwrap_err();
    assert_eq!(e.code, 413, "{e:?}");
}

#[tokio::test]
async fn bad_uploads_get_clear_errors() {
    let server = NatsServer::start_with_tenants(&["acme"]);
    let _store = store(&server).await;
    let (nc, acme) = agent(&server, "acme").await;
    acme.init("s1").await.unwrap();
    let up = subject(WorkspaceOp::Upload);
    let write = subject(WorkspaceOp::Write);

    // Oversized chunk: 413 (the 700 KiB limit; still inside the 1 MiB message).
    let big = chunk("s1", "u1", 0, vec![0; 720 * 1024]);
    let e = raw::<_, WsUploadAck>(&nc, up.clone(), &big)
        .await
        .unwrap_err();
    assert_eq!(e.code, 413, "{e:?}");
    // A chunk of an upload never opened: 404.
    let e = raw::<_, WsUploadAck>(&nc, up.clone(), &chunk("s1", "nope", 3, vec![1]))
        .await
        .unwrap_err();
    assert_eq!(e.code, 404, "{e:?}");

    // Chunks out of order, one sent twice (idempotent), one missing: 409 until it arrives.
    for seq in [0, 2, 2] {
        raw::<_, WsUploadAck>(
            &nc,
            up.clone(),
            &chunk("s1", "u2", seq, vec![seq as u8; 100]),
        )
        .await
        .unwrap();
    }
    let whole: Vec<u8> = (0..3u8).flat_map(|s| vec![s; 100]).collect();
    let commit = UploadRef {
        upload_id: "u2".into(),
        chunks: 3,
        sha256: hex::encode(Sha256::digest(&whole)),
    };
    let e = raw::<_, messages::workspace::WsEntry>(
        &nc,
        write.clone(),
        &write_upload("s1", "f", commit.clone()),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 409, "{e:?}");
    raw::<_, WsUploadAck>(&nc, up.clone(), &chunk("s1", "u2", 1, vec![1; 100]))
        .await
        .unwrap();
    let entry: messages::workspace::WsEntry =
        raw(&nc, write.clone(), &write_upload("s1", "f", commit.clone()))
            .await
            .unwrap();
    assert_eq!(entry.size, 300);
    assert_eq!(acme.read("s1", "f").await.unwrap(), whole);
    // Committed uploads are gone: committing again is 404.
    let e = raw::<_, messages::workspace::WsEntry>(
        &nc,
        write.clone(),
        &write_upload("s1", "g", commit),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 404, "{e:?}");

    // Wrong sha256: 400, and the upload is ended.
    raw::<_, WsUploadAck>(&nc, up.clone(), &chunk("s1", "u3", 0, vec![9; 10]))
        .await
        .unwrap();
    let wrong = UploadRef {
        upload_id: "u3".into(),
        chunks: 1,
        sha256: "0".repeat(64),
    };
    let e = raw::<_, messages::workspace::WsEntry>(
        &nc,
        write.clone(),
        &write_upload("s1", "h", wrong.clone()),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 400, "{e:?}");
    let e =
        raw::<_, messages::workspace::WsEntry>(&nc, write.clone(), &write_upload("s1", "h", wrong))
            .await
            .unwrap_err();
    assert_eq!(e.code, 404, "{e:?}");

    // Too many uploads open in one session: 409.
    for i in 0..messages::workspace::MAX_UPLOADS_PER_SESSION {
        raw::<_, WsUploadAck>(
            &nc,
            up.clone(),
            &chunk("s1", &format!("open{i}"), 0, vec![1]),
        )
        .await
        .unwrap();
    }
    let e = raw::<_, WsUploadAck>(&nc, up.clone(), &chunk("s1", "one-more", 0, vec![1]))
        .await
        .unwrap_err();
    assert_eq!(e.code, 409, "{e:?}");
}

#[tokio::test]
async fn an_abandoned_upload_expires() {
    let server = NatsServer::start_with_tenants(&["acme"]);
    let mut c = config(&server.service_url(ServiceName::WorkspaceStore), "ws-ttl");
    c.upload_ttl = std::time::Duration::from_secs(1);
    let _store = store_with(&server, c).await;
    let (nc, acme) = agent(&server, "acme").await;
    acme.init("s1").await.unwrap();
    raw::<_, WsUploadAck>(
        &nc,
        subject(WorkspaceOp::Upload),
        &chunk("s1", "gone", 0, vec![1; 10]),
    )
    .await
    .unwrap();
    let commit = UploadRef {
        upload_id: "gone".into(),
        chunks: 1,
        sha256: hex::encode(Sha256::digest([1u8; 10])),
    };
    test_support::eventually_true("the upload to expire", TIMEOUT, || {
        let (nc, req) = (nc.clone(), write_upload("s1", "f", commit.clone()));
        async move {
            raw::<_, messages::workspace::WsEntry>(&nc, subject(WorkspaceOp::Write), &req)
                .await
                .is_err_and(|e| e.kind == messages::ErrorKind::NotFound)
        }
    })
    .await;
}

/// A tenant's `workspace_bytes` quota counts all its workspaces together (each
/// session alone is under it), is answered with 429 naming the quota, frees up when files go,
/// and another tenant is not counted with it. The store follows the tenancy file it was
/// started with.
#[tokio::test]
async fn a_tenant_over_its_workspace_bytes_quota_gets_429_across_its_sessions() {
    let mut tenancy = sandmesh_auth::Tenancy::generate(&Subjects::default());
    for t in ["acme", "beta"] {
        tenancy.add_tenant(&messages::tenancy::Tenant::new(t).unwrap());
    }
    let quota = messages::quota::Quotas {
        workspace_bytes: Some(MB as u64),
        ..Default::default()
    };
    tenancy.set_quotas(&messages::tenancy::Tenant::new("acme").unwrap(), quota);
    let server = NatsServer::start_with_tenancy(tenancy.clone());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenancy.json");
    tenancy.save(&file).unwrap();
    let url = server.service_url(ServiceName::WorkspaceStore);
    let mut c = config(&url, "ws-quota");
    c.kit.tenancy_file = Some(file);
    let _store = store_with(&server, c).await;
    let (_, acme) = agent(&server, "acme").await;
    let (_, beta) = agent(&server, "beta").await;

    let part = bytes(600 * 1024, 3);
    for s in ["s1", "s2"] {
        acme.init(s).await.unwrap();
    }
    acme.write("s1", "a.bin", &part).await.unwrap();
    let e = acme.write("s2", "b.bin", &part).await.unwrap_err();
    let body = e.service_error().expect("the store refused");
    assert_eq!(body.kind, messages::ErrorKind::Overloaded, "{body:?}");
    let d = body.details.as_ref().unwrap();
    assert_eq!(d["quota"], "workspace_bytes", "{body:?}");
    assert_eq!(d["limit"], MB as u64);
    let used = d["used"].as_u64().unwrap();
    assert!(
        (part.len() as u64..MB as u64).contains(&used),
        "s1's file counted: {used}"
    );
    assert!(
        acme.read("s2", "b.bin").await.is_err(),
        "nothing of it landed"
    );

    beta.init("s1").await.unwrap();
    beta.write("s1", "a.bin", &part).await.unwrap();
    beta.write("s1", "b.bin", &part).await.unwrap();

    acme.delete("s1", "a.bin", false).await.unwrap();
    acme.write("s2", "b.bin", &part).await.unwrap();
}
