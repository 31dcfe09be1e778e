//! Uploads through real HTTP into a real workspace-store: forms of several files, bodies that
//! stall, and hostile input (broken boundaries, paths that climb out, parts over the quota).
//! None of them may leave a file behind.

use std::time::Duration;

use crate::common::{start_store_mesh, Gateway};
use bytes::Bytes;
use futures::StreamExt;
use gateway::files::FormUpload;
use sha2::{Digest, Sha256};

const BOUNDARY: &str = "sandmesh-test-boundary-7d1f";

/// A multipart/form-data body of these `(field, filename, content)` parts.
fn form(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, filename, content) in parts {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        let disposition = match filename {
            Some(f) => format!("form-data; name=\"{field}\"; filename=\"{f}\""),
            None => format!("form-data; name=\"{field}\""),
        };
        body.extend_from_slice(format!("Content-Disposition: {disposition}\r\n").as_bytes());
        body.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

fn form_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

/// Bytes that are not text and not a multiple of any chunk size.
fn noise(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

async fn absent(gw: &Gateway, key: &str, session: &str, path: &str) {
    let r = gw
        .send(
            "GET",
            &format!("/api/v1/sessions/{session}/files/{path}"),
            Some(key),
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 404, "{path} must not exist: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_form_of_two_files_lands_whole() {
    let (mesh, store) = start_store_mesh(1024).await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let big = noise(3 * 1024 * 1024 + 17, 1);
    let body = form(&[
        ("file", Some("notes.txt"), b"two files\n"),
        ("file", Some("sub/big.bin"), &big),
    ]);
    let r = gw
        .send(
            "POST",
            "/api/v1/sessions/form1/files?dir=data",
            Some(&key),
            &[("content-type", &form_type())],
            body,
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let up: FormUpload = r.json();
    let paths: Vec<&str> = up.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["data/notes.txt", "data/sub/big.bin"]);
    assert_eq!(up.files[1].size, big.len() as u64);
    let r = gw
        .send(
            "GET",
            "/api/v1/sessions/form1/files/data/sub/big.bin",
            Some(&key),
            &[],
            "",
        )
        .await;
    assert!(r.status == 200 && r.body[..] == big[..], "big.bin differs");
    let r = gw
        .send(
            "GET",
            "/api/v1/sessions/form1/files/data/notes.txt",
            Some(&key),
            &[],
            "",
        )
        .await;
    assert_eq!(&r.body[..], b"two files\n");

    gw.stop().await;
    store.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_stalls_fails_clearly_and_leaves_nothing() {
    let (mesh, store) = start_store_mesh(1024).await;
    let idle = Duration::from_millis(800);
    let gw = Gateway::start(&mesh, |c| c.limits.body_idle_timeout = idle).await;
    let key = gw.key("default");
    // Raw: a few chunks' worth sent (so the upload is under way), then silence.
    let sent = Bytes::from(noise(3 * 1024 * 1024, 2));
    let body = futures::stream::iter([sent]).chain(futures::stream::pending());
    let length = (10 * 1024 * 1024).to_string();
    let r = gw
        .send_stream(
            "PUT",
            "/api/v1/sessions/stall1/files/data/half.bin",
            Some(&key),
            &[("content-length", &length)],
            body,
        )
        .await;
    let p = r.problem();
    assert_eq!((p.status, p.kind.as_str()), (408, "timeout"), "{p:?}");
    absent(&gw, &key, "stall1", "data/half.bin").await;

    // A form: the first part whole, the second cut off by the silence.
    let mut start = form(&[("file", Some("first.txt"), b"whole")]);
    start.truncate(start.len() - format!("--{BOUNDARY}--\r\n").len());
    start.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; \
             filename=\"second.bin\"\r\n\r\npartial"
        )
        .as_bytes(),
    );
    let body = futures::stream::iter([Bytes::from(start)]).chain(futures::stream::pending());
    let r = gw
        .send_stream(
            "POST",
            "/api/v1/sessions/stall1/files",
            Some(&key),
            &[("content-type", &form_type())],
            body,
        )
        .await;
    assert_eq!(r.problem().status, 408, "{r:?}");
    absent(&gw, &key, "stall1", "first.txt").await;
    absent(&gw, &key, "stall1", "second.bin").await;

    // A JSON body stalls the same way.
    let body = futures::stream::iter([Bytes::from_static(b"{\"language\":")])
        .chain(futures::stream::pending());
    let r = gw
        .send_stream(
            "POST",
            "/api/v1/execute",
            Some(&key),
            &[("content-type", "application/json")],
            body,
        )
        .await;
    assert_eq!(r.problem().status, 408, "{r:?}");

    // Failed uploads were dropped, not left open: the session can still open eight at once.
    let uploads = futures::future::join_all((0..8).map(|i| {
        let (gw, k) = (&gw, Some(key.as_str()));
        async move {
            let data = noise(1024 * 1024, i);
            let r = gw
                .send(
                    "PUT",
                    &format!("/api/v1/sessions/stall1/files/many/{i}.bin"),
                    k,
                    &[],
                    data.clone(),
                )
                .await;
            (
                r.status,
                r.json::<messages::workspace::WsEntry>().sha256,
                data,
            )
        }
    }))
    .await;
    for (status, sha, data) in uploads {
        assert_eq!(status, 200);
        assert_eq!(sha, Some(hex::encode(Sha256::digest(&data))));
    }

    gw.stop().await;
    store.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_forms_are_refused_and_leave_nothing() {
    let quota_mb = 4;
    let (mesh, store) = start_store_mesh(quota_mb).await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let k = Some(key.as_str());
    let path = "/api/v1/sessions/hostile1/files";
    let form_ct = form_type();
    let ct = [("content-type", form_ct.as_str())];

    // Boundaries: none, one the body never uses, a body that never ends its last part.
    let good = form(&[("file", Some("ok.txt"), b"fine")]);
    let no_boundary = [("content-type", "multipart/form-data")];
    let r = gw.send("POST", path, k, &no_boundary, good.clone()).await;
    assert_eq!(r.problem().kind, "bad_request", "{r:?}");
    let other = [("content-type", "multipart/form-data; boundary=not-the-one")];
    let r = gw.send("POST", path, k, &other, good.clone()).await;
    assert_eq!(r.problem().kind, "bad_request", "{r:?}");
    let mut unended = good.clone();
    unended.truncate(good.len() - format!("\r\n--{BOUNDARY}--\r\n").len());
    let r = gw.send("POST", path, k, &ct, unended).await;
    assert_eq!(r.problem().kind, "bad_request", "{r:?}");
    let r = gw
        .send("POST", path, k, &ct, b"no parts here at all".to_vec())
        .await;
    assert_eq!(r.problem().kind, "bad_request", "{r:?}");
    absent(&gw, &key, "hostile1", "ok.txt").await;

    // Paths that climb out of the workspace, in a part's filename or in `dir`: refused before
    // anything is stored, and the good part before them is not kept either.
    for bad in [
        "../escape.txt",
        "/etc/passwd",
        "a/../../b",
        "%2e%2e/x",
        "a\\..\\b",
    ] {
        let body = form(&[
            ("file", Some("before.txt"), b"first"),
            ("file", Some(bad), b"payload"),
        ]);
        let r = gw.send("POST", path, k, &ct, body).await;
        assert_eq!(r.problem().kind, "bad_request", "{bad}: {r:?}");
    }
    let r = gw
        .send("POST", &format!("{path}?dir=../up"), k, &ct, good.clone())
        .await;
    assert_eq!(r.problem().kind, "bad_request", "{r:?}");
    let r = gw
        .send("PUT", &format!("{path}/..%2F..%2Fx"), k, &[], "raw")
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    absent(&gw, &key, "hostile1", "before.txt").await;

    // A part over the workspace quota: 413, and the small part before it is not kept.
    let over = noise((quota_mb as usize + 1) * 1024 * 1024, 3);
    let body = form(&[
        ("file", Some("small.txt"), b"small"),
        ("file", Some("over.bin"), &over),
    ]);
    let r = gw.send("POST", path, k, &ct, body).await;
    assert_eq!(r.problem().kind, "too_large", "{r:?}");
    absent(&gw, &key, "hostile1", "small.txt").await;
    absent(&gw, &key, "hostile1", "over.bin").await;
    // The same as a raw body, without a length to refuse it by in advance.
    let body = futures::stream::iter(
        over.chunks(256 * 1024)
            .map(Bytes::copy_from_slice)
            .collect::<Vec<_>>(),
    );
    let r = gw
        .send_stream("PUT", &format!("{path}/over.bin"), k, &[], body)
        .await;
    assert_eq!(r.problem().kind, "too_large", "{r:?}");
    absent(&gw, &key, "hostile1", "over.bin").await;

    gw.stop().await;
    store.stop().await;
    mesh.shutdown().await;
}

/// `POST …/files/upload` is the form upload under its dedicated name; a file named
/// `upload` is still reachable with PUT and GET; bad input on that path is refused like on
/// the form path and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_seed_upload_path_is_the_form_upload() {
    let (mesh, store) = start_store_mesh(16).await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let k = Some(key.as_str());
    let seed = "/api/v1/sessions/seed1/files/upload";
    let form_ct = form_type();
    let ct = [("content-type", form_ct.as_str())];

    let body = form(&[
        ("file", Some("a.txt"), b"first"),
        ("file", Some("b.csv"), b"x,y\n1,2\n"),
    ]);
    let r = gw
        .send("POST", &format!("{seed}?dir=data"), k, &ct, body)
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let up: FormUpload = r.json();
    let paths: Vec<&str> = up.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["data/a.txt", "data/b.csv"]);
    let r = gw
        .send("GET", "/api/v1/sessions/seed1/files/data/b.csv", k, &[], "")
        .await;
    assert_eq!((r.status, &r.body[..]), (200, &b"x,y\n1,2\n"[..]));

    // A file called `upload`: written with PUT, read back with GET.
    let r = gw.send("PUT", seed, k, &[], "a file named upload").await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = gw.send("GET", seed, k, &[], "").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"a file named upload"[..]));

    // Not a form, no boundary, a climbing filename or dir, no key: refused, nothing kept.
    let r = gw.send("POST", seed, k, &[], "raw bytes, not a form").await;
    assert_eq!(r.problem().kind, "bad_request", "{r:?}");
    let no_boundary = [("content-type", "multipart/form-data")];
    let good = form(&[("file", Some("kept.txt"), b"no")]);
    let r = gw.send("POST", seed, k, &no_boundary, good.clone()).await;
    assert_eq!(r.problem().kind, "bad_request", "{r:?}");
    let climbing = form(&[
        ("file", Some("kept.txt"), b"no"),
        ("file", Some("../out.txt"), b"no"),
    ]);
    let r = gw.send("POST", seed, k, &ct, climbing).await;
    assert_eq!(r.problem().kind, "bad_request", "{r:?}");
    let r = gw
        .send("POST", &format!("{seed}?dir=../up"), k, &ct, good.clone())
        .await;
    assert_eq!(r.problem().kind, "bad_request", "{r:?}");
    let r = gw.send("POST", seed, None, &ct, good.clone()).await;
    assert_eq!(r.problem().kind, "unauthorized", "{r:?}");
    absent(&gw, &key, "seed1", "kept.txt").await;
    absent(&gw, &key, "seed1", "out.txt").await;

    // Over the quota on the seed path: 413, nothing kept.
    let over = noise(17 * 1024 * 1024, 5);
    let body = form(&[
        ("file", Some("small.txt"), b"s"),
        ("file", Some("over.bin"), &over),
    ]);
    let r = gw.send("POST", seed, k, &ct, body).await;
    assert_eq!(r.problem().kind, "too_large", "{r:?}");
    absent(&gw, &key, "seed1", "small.txt").await;

    gw.stop().await;
    store.stop().await;
    mesh.shutdown().await;
}
