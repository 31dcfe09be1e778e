//! The security catalogue's `path_traversal_api` and `zip_slip` rows, over real NATS: every
//! hostile path or archive is refused with a clear 4xx, nothing is written (no index entry,
//! no object), and the service keeps answering.

use crate::common::*;
use messages::subjects::WorkspaceOp;
use messages::workspace::{
    WsEntry, WsFile, WsListing, WsPath, WsRead, WsRestore, WsRestored, WsWrite,
};
use messages::{ErrorKind, Subjects};
use tar::EntryType;
use test_support::NatsServer;

const SESSION: &str = "victim";

fn hostile_paths() -> Vec<(&'static str, String)> {
    vec![
        ("dotdot", "../x".into()),
        ("dotdot_deep", "code/../../etc/passwd".into()),
        ("percent", "%2e%2e/x".into()),
        ("percent_upper", "%2E%2E/x".into()),
        ("double_percent", "%252e%252e/x".into()),
        ("percent_slash", "a%2f..%2fx".into()),
        ("backslash", "..\\x".into()),
        ("fullwidth", "\u{FF0E}\u{FF0E}\u{FF0F}x".into()),
        ("nul", "a\0b".into()),
        ("newline", "a\nb".into()),
        ("overlong_name", "n".repeat(256)),
        ("overlong_path", format!("{}x", "abcdefgh/".repeat(120))),
        ("absolute", "/etc/passwd".into()),
        ("empty", "".into()),
        ("dot", ".".into()),
        ("empty_component", "a//b".into()),
        ("bidi_override", "evil\u{202E}txt.exe".into()),
    ]
}

#[tokio::test]
async fn traversal_catalogue_is_refused_and_nothing_is_written() {
    let nats = NatsServer::start();
    let _svc = start(config(&nats.url(), "t1")).await;
    let ws = client(&nats.url()).await;
    ws.init(SESSION).await.unwrap();
    let before = store_state(&nats.url(), &[SESSION]).await;
    let usage_before = ws.usage(SESSION).await.unwrap();
    let nc = crate::common::nats(&nats.url()).await;
    let s = Subjects::default();

    for (row, path) in hostile_paths() {
        let write = WsWrite {
            session_id: SESSION.into(),
            path: path.clone(),
            content: "pwned".into(),
            encoding: Default::default(),
            append: false,
            requested_by: None,
            object: None,
            upload: None,
        };
        let e = raw::<_, WsEntry>(&nc, s.workspace(WorkspaceOp::Write), &write)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadRequest, "{row} write: {e:?}");
        assert!(!e.message.is_empty(), "{row}: the error says why");

        let read = WsRead {
            session_id: SESSION.into(),
            path: path.clone(),
            offset: None,
            length: None,
            encoding: None,
        };
        let e = raw::<_, WsFile>(&nc, s.workspace(WorkspaceOp::Read), &read)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadRequest, "{row} read: {e:?}");

        let target = WsPath {
            session_id: SESSION.into(),
            path: path.clone(),
            recursive: true,
            requested_by: None,
        };
        for op in [WorkspaceOp::Stat, WorkspaceOp::Delete] {
            let e = raw::<_, serde_json::Value>(&nc, s.workspace(op), &target)
                .await
                .unwrap_err();
            assert_eq!(e.kind, ErrorKind::BadRequest, "{row} {op:?}: {e:?}");
        }
        if !path.is_empty() && path != "." {
            let list = serde_json::json!({ "session_id": SESSION, "prefix": path });
            let e = raw::<_, WsListing>(&nc, s.workspace(WorkspaceOp::List), &list)
                .await
                .unwrap_err();
            assert_eq!(e.kind, ErrorKind::BadRequest, "{row} list: {e:?}");
        }
    }
    // A session id is a key token too.
    for bad in ["../victim", "victim.f", "*", ">", ""] {
        let e = raw::<_, WsListing>(
            &nc,
            s.workspace(WorkspaceOp::List),
            &serde_json::json!({ "session_id": bad }),
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadRequest, "session {bad:?}");
    }

    assert_eq!(
        store_state(&nats.url(), &[SESSION]).await,
        before,
        "nothing was written"
    );
    assert_eq!(ws.usage(SESSION).await.unwrap().bytes, usage_before.bytes);
    // Still healthy: ordinary work goes on.
    ws.write(SESSION, "code/ok.py", b"print(1)").await.unwrap();
    assert_eq!(ws.read(SESSION, "code/ok.py").await.unwrap(), b"print(1)");
}

/// Restores `tar` and returns the error; asserts nothing changed.
async fn refused(url: &str, tar: Vec<u8>) -> messages::ErrorBody {
    let ws = client(url).await;
    let before = store_state(url, &[SESSION]).await;
    let usage = ws.usage(SESSION).await.unwrap();
    // Archives too large for one message go through the object store, as clients send them.
    let (tar_base64, object) = if tar.len() as u64 > messages::workspace::INLINE_MAX_BYTES {
        (None, Some(upload(url, &tar).await))
    } else {
        (Some(messages::encode_base64(&tar)), None)
    };
    let req = WsRestore {
        session_id: SESSION.into(),
        tar_base64,
        object,
        upload: None,
        replace: false,
        delete: Vec::new(),
        requested_by: None,
    };
    let nc = crate::common::nats(url).await;
    let e = raw::<_, WsRestored>(
        &nc,
        Subjects::default().workspace(WorkspaceOp::Restore),
        &req,
    )
    .await
    .unwrap_err();
    assert_eq!(
        store_state(url, &[SESSION]).await,
        before,
        "nothing written for {e:?}"
    );
    assert_eq!(ws.usage(SESSION).await.unwrap().bytes, usage.bytes);
    e
}

#[tokio::test]
async fn zip_slip_archives_are_refused_whole() {
    let nats = NatsServer::start();
    let mut cfg = config(&nats.url(), "z1");
    cfg.max_restore_entries = 100;
    cfg.max_restore_bytes = 1 << 20;
    let _svc = start(cfg).await;
    let url = nats.url();
    client(&url).await.init(SESSION).await.unwrap();

    // Each archive starts with a harmless file, which must not be written either.
    let ok = || RawTar::default().file("data/ok.txt", b"fine");
    let cases: Vec<(&str, Vec<u8>, ErrorKind)> = vec![
        (
            "dotdot",
            ok().file("../../x", b"x").finish(),
            ErrorKind::BadRequest,
        ),
        (
            "absolute",
            ok().file("/abs/x", b"x").finish(),
            ErrorKind::BadRequest,
        ),
        (
            "dotdot_inside",
            ok().file("a/../../x", b"x").finish(),
            ErrorKind::BadRequest,
        ),
        (
            "symlink_then_write",
            ok().link("lnk", EntryType::Symlink, "/etc")
                .file("lnk/passwd", b"root::0:0")
                .finish(),
            ErrorKind::BadRequest,
        ),
        (
            "hardlink",
            ok().link("hl", EntryType::Link, "/etc/passwd").finish(),
            ErrorKind::BadRequest,
        ),
        (
            "char_device",
            ok().entry(b"dev", EntryType::Char, 0o666, b"").finish(),
            ErrorKind::BadRequest,
        ),
        (
            "block_device",
            ok().entry(b"blk", EntryType::Block, 0o666, b"").finish(),
            ErrorKind::BadRequest,
        ),
        (
            "fifo",
            ok().entry(b"fifo", EntryType::Fifo, 0o666, b"").finish(),
            ErrorKind::BadRequest,
        ),
        (
            "bomb_by_count",
            (0..101)
                .fold(RawTar::default(), |t, i| t.file(&format!("f{i}"), b"x"))
                .finish(),
            ErrorKind::TooLarge,
        ),
        (
            "bomb_by_size",
            ok().file("a", &bytes(600 * 1024, 1))
                .file("b", &bytes(600 * 1024, 2))
                .finish(),
            ErrorKind::TooLarge,
        ),
        (
            "bomb_declared_size",
            ok().declared("huge", 10 << 30).finish(),
            ErrorKind::TooLarge,
        ),
        (
            "long_name_bomb",
            ok().entry(
                b"././@LongLink",
                EntryType::GNULongName,
                0o644,
                &[b'a'; 8192],
            )
            .file("x", b"x")
            .finish(),
            ErrorKind::BadRequest,
        ),
        (
            "long_name_dotdot",
            ok().entry(
                b"././@LongLink",
                EntryType::GNULongName,
                0o644,
                b"../../escape\0",
            )
            .file("x", b"x")
            .finish(),
            ErrorKind::BadRequest,
        ),
        (
            "pax_path_dotdot",
            ok().entry(b"pax", EntryType::XHeader, 0o644, b"19 path=../../evil\n")
                .file("x", b"x")
                .finish(),
            ErrorKind::BadRequest,
        ),
        (
            "file_under_file",
            ok().file("data/ok.txt/inner", b"x").finish(),
            ErrorKind::BadRequest,
        ),
        (
            "not_a_tar",
            b"this is not a tar archive at all".repeat(20),
            ErrorKind::BadRequest,
        ),
    ];
    for (row, tar, kind) in cases {
        let e = refused(&url, tar).await;
        assert_eq!(e.kind, kind, "{row}: {e:?}");
    }
    // Still healthy.
    let ws = client(&url).await;
    assert!(ws.list(SESSION, None, true).await.is_ok());
}

#[tokio::test]
async fn setuid_and_setgid_bits_are_stripped() {
    let nats = NatsServer::start();
    let _svc = start(config(&nats.url(), "u1")).await;
    let ws = client(&nats.url()).await;
    let tar = RawTar::default()
        .entry(b"bin/tool", EntryType::Regular, 0o6755, b"#!/bin/sh\n")
        .entry(b"bin/sticky", EntryType::Regular, 0o1777, b"x")
        .finish();
    let done = ws.restore(SESSION, &tar, false, Vec::new()).await.unwrap();
    assert_eq!(done.files_created, ["bin/sticky", "bin/tool"]);
    assert_eq!(ws.stat(SESSION, "bin/tool").await.unwrap().mode, 0o755);
    assert_eq!(ws.stat(SESSION, "bin/sticky").await.unwrap().mode, 0o777);
    // And what goes out carries the stripped mode.
    let snap = ws.snapshot(SESSION, Some("bin")).await.unwrap();
    let mut archive = tar::Archive::new(&snap[..]);
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        assert_eq!(
            entry.header().mode().unwrap() & 0o7000,
            0,
            "{:?}",
            entry.path()
        );
    }
}
