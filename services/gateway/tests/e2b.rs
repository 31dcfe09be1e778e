//! The E2B facade as a raw HTTP client sees it: real HTTP against the gateway's second
//! listener, over a real nats-server with the shipped accounts and the real services. Every
//! malformed, oversized or hostile request gets an error in E2B's shape (never a hang: every
//! answer is read within `BOUND`), each beside a positive control that the same route works.
//! E2B's own SDKs are tested against it in `e2b-tests/` (pytest).

use crate::common::{start_mesh, Gateway, Mesh, Reply};
use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};

/// Tenants, NATS, the workspace store and the scheduler: sandboxes open (no container is
/// placed before something runs), so every route's refusals can be reached.
async fn sessions_mesh() -> Mesh {
    Mesh::builder()
        .tenants(&["acme"], &[])
        .real_workspace()
        .scheduler(|_| {})
        .start()
        .await
}

fn api(key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("x-api-key", key.to_string()),
        ("content-type", "application/json".into()),
    ]
}

fn envd(id: &str, token: &str, content_type: &str) -> Vec<(&'static str, String)> {
    vec![
        ("e2b-sandbox-id", id.to_string()),
        ("e2b-sandbox-port", "49983".into()),
        ("x-access-token", token.to_string()),
        ("content-type", content_type.into()),
    ]
}

fn envelope(flags: u8, json: &[u8]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json);
    out
}

/// E2B's REST error: `{"code": <the status>, "message"}`.
#[track_caller]
fn rest_error(r: &Reply, status: u16) -> String {
    assert_eq!(r.status, status, "{r:?}");
    let body: Value = r.json();
    assert_eq!(body["code"], status, "{r:?}");
    body["message"].as_str().expect("a message").to_string()
}

/// Connect's error: `{"code": "<name>", "message"}`.
#[track_caller]
fn rpc_error(r: &Reply, status: u16, code: &str) -> String {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    let body: Value = r.json();
    assert_eq!(body["code"], code, "{r:?}");
    body["message"].as_str().expect("a message").to_string()
}

/// Creates a sandbox with `key`: its id and token.
async fn create(gw: &Gateway, key: &str) -> (String, String) {
    let r = gw
        .e2b_send(
            "POST",
            "/v2/sandboxes",
            &api(key),
            r#"{"templateID":"base","timeout":300}"#,
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let body: Value = r.json();
    assert_eq!(body["envdVersion"], gateway::e2b::ENVD_VERSION);
    (
        body["sandboxID"].as_str().unwrap().to_string(),
        body["envdAccessToken"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_plane_refuses_in_e2b_s_shape() {
    let mesh = sessions_mesh().await;
    let gw = Gateway::start(&mesh, |c| c.limits.json_max_bytes = 4096).await;
    let key = gw.key("default");
    let e2b_key = gateway::keys::e2b_spelling(&key).unwrap();

    // Positive controls: both spellings of the key act as the tenant.
    let (id, _) = create(&gw, &key).await;
    let listed = gw
        .e2b_send("GET", "/v2/sandboxes", &api(&e2b_key), "")
        .await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let ids: Vec<Value> = listed
        .json::<Vec<Value>>()
        .iter()
        .map(|s| s["sandboxID"].clone())
        .collect();
    assert!(ids.contains(&json!(id)), "{ids:?}");

    let no_key = [("content-type", "application/json".to_string())];
    let r = gw.e2b_send("POST", "/v2/sandboxes", &no_key, "{}").await;
    assert!(rest_error(&r, 401).contains("X-API-KEY"));
    let mut forged = e2b_key.clone();
    forged.replace_range(10..11, if &e2b_key[10..11] == "0" { "1" } else { "0" });
    for bad in [
        forged.as_str(),
        "e2b_",
        "e2b_00ff",
        "Bearer x",
        &key[..key.len() - 1],
    ] {
        let r = gw.e2b_send("GET", "/v2/sandboxes", &api(bad), "").await;
        rest_error(&r, 401);
    }
    // Malformed and oversized bodies.
    for body in ["{", "[]", r#"{"timeout":"soon"}"#, r#"{"envVars":{"A":1}}"#] {
        let r = gw.e2b_send("POST", "/v2/sandboxes", &api(&key), body).await;
        rest_error(&r, 400);
    }
    let huge = format!(r#"{{"templateID":"{}"}}"#, "x".repeat(8192));
    let r = gw.e2b_send("POST", "/v2/sandboxes", &api(&key), huge).await;
    rest_error(&r, 413);
    // What sandmesh has no counterpart for is named; a route that does not exist is 404.
    let paused = gw
        .e2b_send("POST", "/v2/sandboxes", &api(&key), r#"{"autoPause":true}"#)
        .await;
    assert!(rest_error(&paused, 501).contains("paus"));
    for (method, path, named) in [
        ("POST", format!("/sandboxes/{id}/pause"), "pausing"),
        ("POST", format!("/v2/sandboxes/{id}/resume"), "resuming"),
        ("POST", format!("/sandboxes/{id}/snapshots"), "snapshots"),
        ("GET", "/templates".to_string(), "templates"),
        ("POST", "/contexts".to_string(), "contexts"),
    ] {
        let r = gw.e2b_send(method, &path, &api(&key), "{}").await;
        assert!(rest_error(&r, 501).contains(named), "{path}: {r:?}");
    }
    let r = gw
        .e2b_send("GET", "/no/such/route/here", &api(&key), "")
        .await;
    rest_error(&r, 404);
    // An unknown sandbox, and one of another tenant, are not found (with a control: the owner
    // finds it).
    let acme = gw.key("acme");
    let mine = gw
        .e2b_send("GET", &format!("/sandboxes/{id}"), &api(&key), "")
        .await;
    assert_eq!(mine.status, 200, "{mine:?}");
    for (k, sandbox) in [(&acme, id.as_str()), (&key, "no-such-sandbox")] {
        let r = gw
            .e2b_send("GET", &format!("/sandboxes/{sandbox}"), &api(k), "")
            .await;
        rest_error(&r, 404);
        let r = gw
            .e2b_send("DELETE", &format!("/sandboxes/{sandbox}"), &api(k), "")
            .await;
        rest_error(&r, 404);
    }
    let r = gw
        .e2b_send(
            "POST",
            &format!("/sandboxes/{id}/timeout"),
            &api(&key),
            r#"{"timeout":0}"#,
        )
        .await;
    rest_error(&r, 400);
    let r = gw
        .e2b_send(
            "POST",
            &format!("/sandboxes/{id}/timeout"),
            &api(&key),
            r#"{"timeout":600}"#,
        )
        .await;
    assert_eq!(r.status, 204, "{r:?}");
    let killed = gw
        .e2b_send("DELETE", &format!("/sandboxes/{id}"), &api(&key), "")
        .await;
    assert_eq!(killed.status, 204, "{killed:?}");
    let again = gw
        .e2b_send("DELETE", &format!("/sandboxes/{id}"), &api(&key), "")
        .await;
    rest_error(&again, 404);
    gw.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sandbox_routes_refuse_hostile_requests_in_e2b_s_shape() {
    let mesh = sessions_mesh().await;
    let gw = Gateway::start(&mesh, |c| {
        c.limits.body_idle_timeout = std::time::Duration::from_secs(1)
    })
    .await;
    let key = gw.key("default");
    let (id, token) = create(&gw, &key).await;
    let (other_id, other_token) = create(&gw, &key).await;
    let acme = gw.key("acme");
    let (acme_id, acme_token) = create(&gw, &acme).await;
    let stat = |path: &str| json!({ "path": path }).to_string();
    const UNARY: &str = "application/json";
    const STREAM: &str = "application/connect+json";

    // Positive control: the sandbox's token reaches its files.
    let ok = gw
        .e2b_send(
            "POST",
            "/filesystem.Filesystem/Stat",
            &envd(&id, &token, UNARY),
            stat("/home/user"),
        )
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.json::<Value>()["entry"]["type"], "FILE_TYPE_DIRECTORY");

    // Tokens: missing, forged, another sandbox's, another tenant's (for this sandbox's id).
    let stat_as = |sandbox: &str, token: &str| envd(sandbox, token, UNARY);
    let mut forged = token.clone();
    forged.pop();
    forged.push(if token.ends_with('0') { '1' } else { '0' });
    for headers in [
        stat_as(&id, &forged),
        stat_as(&id, &other_token),
        stat_as(&id, &acme_token),
        stat_as(&acme_id, &token),
        stat_as(&id, &key),
        stat_as(&id, ""),
    ] {
        let r = gw
            .e2b_send(
                "POST",
                "/filesystem.Filesystem/Stat",
                &headers,
                stat("/home/user"),
            )
            .await;
        rpc_error(&r, 401, "unauthenticated");
        let r = gw.e2b_send("GET", "/files?path=a.txt", &headers, "").await;
        rest_error(&r, 401);
    }
    let mut no_id = envd(&id, &token, UNARY);
    no_id.retain(|(n, _)| *n != "e2b-sandbox-id");
    let r = gw
        .e2b_send(
            "POST",
            "/filesystem.Filesystem/Stat",
            &no_id,
            stat("/home/user"),
        )
        .await;
    rpc_error(&r, 400, "invalid_argument");

    // Content types: a unary method takes JSON, a stream enveloped JSON; protobuf is refused.
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"]}});
    let start = serde_json::to_vec(&start).unwrap();
    for (path, content_type, body) in [
        (
            "/filesystem.Filesystem/Stat",
            "application/proto",
            stat("a").into_bytes(),
        ),
        (
            "/filesystem.Filesystem/Stat",
            STREAM,
            envelope(0, stat("a").as_bytes()),
        ),
        ("/process.Process/Start", UNARY, start.clone()),
        (
            "/process.Process/Start",
            "application/connect+proto",
            envelope(0, &start),
        ),
    ] {
        let r = gw
            .e2b_send("POST", path, &envd(&id, &token, content_type), body)
            .await;
        rpc_error(&r, 415, "invalid_argument");
    }
    // Bad envelopes: short, compressed, an end-of-stream flag, a length past the body (4 GiB
    // declared), two messages, and no envelope at all.
    let good = envelope(0, &start);
    let mut compressed = good.clone();
    compressed[0] = 1;
    let mut end = good.clone();
    end[0] = 2;
    let mut huge = good.clone();
    huge[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
    let mut two = good.clone();
    two.extend_from_slice(&good);
    for body in [
        vec![0, 0],
        compressed,
        end,
        huge,
        two,
        start.clone(),
        good[..good.len() - 1].to_vec(),
    ] {
        let r = gw
            .e2b_send(
                "POST",
                "/process.Process/Start",
                &envd(&id, &token, STREAM),
                body,
            )
            .await;
        rpc_error(&r, 400, "invalid_argument");
    }
    // A message past the cap, and JSON that is not the message.
    let oversized = envelope(0, &vec![b' '; gateway::e2b::connect::MAX_REQUEST_BYTES + 1]);
    let r = gw
        .e2b_send(
            "POST",
            "/process.Process/Start",
            &envd(&id, &token, STREAM),
            oversized,
        )
        .await;
    rpc_error(&r, 413, "resource_exhausted");
    for body in [
        "{",
        r#"{"path": 7}"#,
        r#"{"path": "/etc/passwd"}"#,
        r#"{"path": "../x"}"#,
    ] {
        let r = gw
            .e2b_send(
                "POST",
                "/filesystem.Filesystem/Stat",
                &envd(&id, &token, UNARY),
                body,
            )
            .await;
        rpc_error(&r, 400, "invalid_argument");
    }
    // What the facade does not serve is named; a service that does not exist is not found.
    for method in [
        "process.Process/StreamInput",
        "process.Process/CloseStdin",
        "filesystem.Filesystem/WatchDir",
    ] {
        let r = gw
            .e2b_send(
                "POST",
                &format!("/{method}"),
                &envd(&id, &token, UNARY),
                "{}",
            )
            .await;
        rpc_error(&r, 501, "unimplemented");
    }
    let r = gw
        .e2b_send("POST", "/nope.Nope/Call", &envd(&id, &token, UNARY), "{}")
        .await;
    rest_error(&r, 404);
    // Files: no path, a path outside the workspace, a form without files, a body that stalls.
    let files = |q: &str| format!("/files{q}");
    for q in ["", "?path=/etc/shadow", "?path=a/../../b"] {
        let r = gw
            .e2b_send("GET", &files(q), &envd(&id, &token, UNARY), "")
            .await;
        rest_error(&r, 400);
    }
    let r = gw
        .e2b_send(
            "POST",
            &files("?path=a.txt"),
            &envd(&id, &token, "text/plain"),
            "x",
        )
        .await;
    rest_error(&r, 400);
    let form = "multipart/form-data; boundary=XX";
    let r = gw
        .e2b_send("POST", &files(""), &envd(&id, &token, form), "--XX--\r\n")
        .await;
    rest_error(&r, 400);
    let stalled = futures::StreamExt::chain(
        futures::stream::iter([Bytes::from_static(b"--XX\r\n")]),
        futures::stream::pending(),
    );
    let r = crate::common::open_at(
        gw.e2b,
        "POST",
        &files(""),
        &envd(&id, &token, form),
        http_body_util::StreamBody::new(futures::StreamExt::map(stalled, |b| {
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b))
        })),
    )
    .await;
    assert_eq!(r.status(), 408, "{r:?}");
    // The interpreter: contexts and languages it does not have, malformed cells.
    let ci = |b: &str| b.to_string();
    for (body, status) in [
        (ci(r#"{"code":"1","context_id":"c1"}"#), 501),
        (ci(r#"{"code":"1","language":"r"}"#), 501),
        (ci(r#"{"code":1}"#), 400),
        (ci("{"), 400),
    ] {
        let r = gw
            .e2b_send("POST", "/execute", &envd(&id, &token, UNARY), body)
            .await;
        rest_error(&r, status);
    }
    // A written file round-trips (control), then a killed sandbox's routes are not found.
    let part = "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.txt\"\r\n\r\nalpha\r\n--XX--\r\n";
    let w = gw
        .e2b_send("POST", &files(""), &envd(&id, &token, form), part)
        .await;
    assert_eq!(w.status, 200, "{w:?}");
    assert_eq!(w.json::<Value>()[0]["path"], "/home/user/a.txt");
    let r = gw
        .e2b_send(
            "GET",
            &files("?path=/home/user/a.txt"),
            &envd(&id, &token, UNARY),
            "",
        )
        .await;
    assert_eq!((r.status, &r.body[..]), (200, &b"alpha"[..]), "{r:?}");
    let killed = gw
        .e2b_send("DELETE", &format!("/sandboxes/{id}"), &api(&key), "")
        .await;
    assert_eq!(killed.status, 204);
    let r = gw
        .e2b_send("GET", &files("?path=a.txt"), &envd(&id, &token, UNARY), "")
        .await;
    rest_error(&r, 404);
    let r = gw
        .e2b_send(
            "POST",
            "/filesystem.Filesystem/Stat",
            &envd(&id, &token, UNARY),
            stat("a.txt"),
        )
        .await;
    rpc_error(&r, 404, "not_found");
    // The other sandbox of the same key is untouched.
    let r = gw
        .e2b_send(
            "POST",
            "/filesystem.Filesystem/Stat",
            &envd(&other_id, &other_token, UNARY),
            stat(""),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    gw.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn process_rpcs_refuse_hostile_requests_in_e2b_s_shape() {
    let mesh = sessions_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let (id, token) = create(&gw, &key).await;
    let acme = gw.key("acme");
    let (acme_id, acme_token) = create(&gw, &acme).await;
    const UNARY: &str = "application/json";
    const STREAM: &str = "application/connect+json";
    // One call of `process.Process/<method>` to `sandbox` with `token`.
    let rpc = |sandbox: &str, token: &str, content_type: &str, method: &str, body: Vec<u8>| {
        let headers = envd(sandbox, token, content_type);
        let path = format!("/process.Process/{method}");
        let gw = &gw;
        async move { gw.e2b_send("POST", &path, &headers, body).await }
    };
    let call = |method: &str, body: String| rpc(&id, &token, UNARY, method, body.into_bytes());

    // Positive control: the sandbox lists its processes (none yet), and so does the other
    // tenant's with its own token.
    let r = call("List", "{}".into()).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json::<Value>(), json!({"processes": []}));
    let r = rpc(&acme_id, &acme_token, UNARY, "List", b"{}".to_vec()).await;
    assert_eq!(r.status, 200, "{r:?}");
    // Another tenant's token does not open this sandbox's processes.
    let r = rpc(&id, &acme_token, UNARY, "List", b"{}".to_vec()).await;
    rpc_error(&r, 401, "unauthenticated");

    // A pid or tag that names no process: not found (the SDK's `kill` answers False).
    let b64 = base64::engine::general_purpose::STANDARD;
    let hi = b64.encode("hi");
    for (method, body) in [
        (
            "SendSignal",
            json!({"process": {"pid": 4242}, "signal": "SIGNAL_SIGKILL"}),
        ),
        (
            "SendSignal",
            json!({"process": {"tag": "web"}, "signal": "SIGNAL_SIGTERM"}),
        ),
        (
            "SendInput",
            json!({"process": {"pid": 1073741824u32}, "input": {"stdin": hi}}),
        ),
        (
            "Update",
            json!({"process": {"pid": 1}, "pty": {"size": {"cols": 80, "rows": 24}}}),
        ),
    ] {
        let r = call(method, body.to_string()).await;
        assert!(
            rpc_error(&r, 404, "not_found").contains("not found"),
            "{method}: {r:?}"
        );
    }
    let connect = envelope(0, json!({"process": {"pid": 4242}}).to_string().as_bytes());
    let r = rpc(&id, &token, STREAM, "Connect", connect).await;
    rpc_error(&r, 404, "not_found");

    // Malformed: no selector, a pid that is no uint32, signals envd does not have, input that
    // is not base64 or names both streams, a terminal of no size or beyond the mesh's.
    for (method, body) in [
        (
            "SendSignal",
            json!({"process": {}, "signal": "SIGNAL_SIGKILL"}),
        ),
        (
            "SendSignal",
            json!({"process": {"pid": -1}, "signal": "SIGNAL_SIGKILL"}),
        ),
        (
            "SendSignal",
            json!({"process": {"pid": 4294967296u64}, "signal": 9}),
        ),
        ("SendSignal", json!({"process": {"pid": 4242}})),
        (
            "SendSignal",
            json!({"process": {"pid": 4242}, "signal": "SIGNAL_UNSPECIFIED"}),
        ),
        (
            "SendSignal",
            json!({"process": {"pid": 4242}, "signal": "SIGSTOP"}),
        ),
        (
            "SendSignal",
            json!({"process": {"pid": 4242}, "signal": 19}),
        ),
        (
            "SendInput",
            json!({"process": {"pid": 4242}, "input": {"stdin": "%%%"}}),
        ),
        (
            "SendInput",
            json!({"process": {"pid": 4242}, "input": {"stdin": hi, "pty": hi}}),
        ),
        ("SendInput", json!({"process": {"pid": 4242}, "input": {}})),
        ("Update", json!({"process": {"pid": 4242}})),
        (
            "Update",
            json!({"process": {"pid": 4242}, "pty": {"size": {"cols": 0, "rows": 24}}}),
        ),
        (
            "Update",
            json!({"process": {"pid": 4242}, "pty": {"size": {"cols": 70000, "rows": 24}}}),
        ),
        (
            "Update",
            json!({"process": {"pid": 4242}, "pty": {"size": {"cols": 1001, "rows": 1}}}),
        ),
    ] {
        let r = call(method, body.to_string()).await;
        rpc_error(&r, 400, "invalid_argument");
    }
    for body in ["{", "[1]", r#"{"process": "4242"}"#] {
        let r = call("SendSignal", body.into()).await;
        rpc_error(&r, 400, "invalid_argument");
    }
    // Oversized: input past the mesh's 256 KiB a call, a message past the 1 MiB cap; never
    // 429, which the SDKs retry.
    let big = b64.encode(vec![b'x'; messages::proc::MAX_INPUT_BYTES + 1]);
    let r = call(
        "SendInput",
        json!({"process": {"pid": 4242}, "input": {"stdin": big}}).to_string(),
    )
    .await;
    rpc_error(&r, 413, "resource_exhausted");
    let huge = b64.encode(vec![b'x'; gateway::e2b::connect::MAX_REQUEST_BYTES]);
    let r = call(
        "SendInput",
        json!({"process": {"pid": 4242}, "input": {"pty": huge}}).to_string(),
    )
    .await;
    rpc_error(&r, 413, "resource_exhausted");
    // A start the mesh's bounds refuse is refused before its stream begins.
    let start = |process: Value| envelope(0, json!(process).to_string().as_bytes());
    for (body, status, code) in [
        (
            start(json!({"process": {"cmd": "cat"}, "stdin": true, "tag": "t".repeat(200)})),
            413,
            "resource_exhausted",
        ),
        (
            start(json!({"process": {"cmd": "bash"}, "pty": {"size": {"cols": 0, "rows": 0}}})),
            400,
            "invalid_argument",
        ),
        (
            start(json!({"process": {"cmd": ""}, "stdin": true})),
            400,
            "invalid_argument",
        ),
    ] {
        let r = rpc(&id, &token, STREAM, "Start", body).await;
        rpc_error(&r, status, code);
    }
    gw.stop().await;
    mesh.shutdown().await;
}

/// The frames of a server stream: each message's flag and JSON.
fn frames(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        out.push((
            body[0],
            serde_json::from_slice(&body[5..5 + length]).unwrap(),
        ));
        body = &body[5 + length..];
    }
    assert!(body.is_empty(), "a partial frame at the end");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_and_a_cell_answer_in_envd_s_and_the_interpreter_s_shapes() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let (id, token) = create(&gw, &key).await;
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo out; echo err >&2; exit 3"]}});
    let r = gw
        .e2b_send(
            "POST",
            "/process.Process/Start",
            &envd(&id, &token, "application/connect+json"),
            envelope(0, start.to_string().as_bytes()),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let frames = frames(&r.body);
    assert!(
        frames[0].1["event"]["start"]["pid"].as_u64().is_some(),
        "{frames:?}"
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    for (_, f) in &frames {
        if let Some(s) = f["event"]["data"]["stdout"].as_str() {
            stdout.extend(b64.decode(s).unwrap());
        }
        if let Some(s) = f["event"]["data"]["stderr"].as_str() {
            stderr.extend(b64.decode(s).unwrap());
        }
    }
    assert_eq!(
        (&stdout[..], &stderr[..]),
        (&b"out\n"[..], &b"err\n"[..]),
        "{frames:?}"
    );
    let n = frames.len();
    assert_eq!(frames[n - 2].1["event"]["end"]["exitCode"], 3, "{frames:?}");
    assert_eq!(frames[n - 1], (0x02, json!({})), "{frames:?}");

    let cell = json!({"code": "print('hi')\n6 * 7"}).to_string();
    let r = gw
        .e2b_send(
            "POST",
            "/execute",
            &envd(&id, &token, "application/json"),
            cell,
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let lines: Vec<Value> = String::from_utf8_lossy(&r.body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "stdout" && l["text"] == "hi\n"),
        "{lines:?}"
    );
    let result = lines
        .iter()
        .find(|l| l["type"] == "result")
        .expect("a result line");
    assert_eq!(
        (&result["text"], &result["is_main_result"]),
        (&json!("42"), &json!(true))
    );
    let cell = json!({"code": "1 / 0"}).to_string();
    let r = gw
        .e2b_send(
            "POST",
            "/execute",
            &envd(&id, &token, "application/json"),
            cell,
        )
        .await;
    let error = String::from_utf8_lossy(&r.body)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["type"] == "error")
        .expect("an error line");
    assert_eq!(error["name"], "ZeroDivisionError");
    assert!(error["traceback"]
        .as_str()
        .unwrap()
        .contains("ZeroDivisionError"));
    gw.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tagged_process_is_listed_refused_input_and_streamed_to_its_signal() {
    const BOUND: std::time::Duration = std::time::Duration::from_secs(90);
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let (id, token) = create(&gw, &key).await;
    let unary = envd(&id, &token, "application/json");
    let call = |method: &str, body: Value| {
        let path = format!("/process.Process/{method}");
        let (gw, unary) = (&gw, &unary);
        async move { gw.e2b_send("POST", &path, unary, body.to_string()).await }
    };
    // A tag makes it a process (the SDKs send one only from raw clients and templates).
    let start = json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo started; sleep 600"]},
        "tag": "reader",
        "stdin": false,
    });
    let stream = envd(&id, &token, "application/connect+json");
    let started = gw.e2b_send(
        "POST",
        "/process.Process/Start",
        &stream,
        envelope(0, start.to_string().as_bytes()),
    );
    let feed = async {
        // Once its first line is out (seen over /api/v1: the same process), as E2B lists it.
        let procs = format!("/api/v1/sessions/{id}/processes");
        test_support::eventually("the process's first line", BOUND, || async {
            let r = gw.send("GET", &procs, Some(&key), &[], "").await;
            let body: Value = r.json();
            (body["procs"][0]["next_seq"].as_u64()? > 0).then_some(())
        })
        .await;
        let listed: Value = call("List", json!({})).await.json();
        let listed = listed["processes"][0].clone();
        assert_eq!(listed["tag"], "reader", "{listed}");
        assert_eq!(listed["config"]["cmd"], "/bin/bash", "{listed}");
        let pid = listed["pid"].as_u64().expect("a pid");
        assert!((1u64 << 30..1 << 31).contains(&pid), "a facade pid: {pid}");
        // Input by its tag: a process started without stdin refuses it, in envd's terms.
        let hello = base64::engine::general_purpose::STANDARD.encode("hello\n");
        let input = json!({"process": {"tag": "reader"}, "input": {"stdin": hello}});
        let r = call("SendInput", input).await;
        rpc_error(&r, 400, "failed_precondition");
        // SIGTERM by pid ends it; the start's stream ends with the signal.
        let term = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"});
        let r = call("SendSignal", term).await;
        assert_eq!((r.status, r.json::<Value>()), (200, json!({})), "{r:?}");
        pid
    };
    let (r, pid) = tokio::time::timeout(BOUND, async { tokio::join!(started, feed) })
        .await
        .expect("the start's stream ended");
    assert_eq!(r.status, 200, "{r:?}");
    let frames = frames(&r.body);
    assert_eq!(frames[0].1["event"]["start"]["pid"], pid, "{frames:?}");
    let started = base64::engine::general_purpose::STANDARD.encode("started\n");
    assert_eq!(
        frames[1].1["event"]["data"]["stdout"], started,
        "{frames:?}"
    );
    let n = frames.len();
    let end = &frames[n - 2].1["event"]["end"];
    assert_eq!(
        (&end["exitCode"], &end["exited"], &end["status"]),
        (&json!(-1), &json!(false), &json!("signal: terminated")),
        "{frames:?}"
    );
    assert_eq!(frames[n - 1], (0x02, json!({})), "{frames:?}");
    // It ended: no longer listed, and its pid names nothing.
    let listed: Value = call("List", json!({})).await.json();
    assert_eq!(listed, json!({"processes": []}));
    let kill = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
    let r = call("SendSignal", kill).await;
    rpc_error(&r, 404, "not_found");
    gw.stop().await;
    mesh.shutdown().await;
}
