//! JSON bodies over HTTP are held to their types as NATS payloads are: a field the body's
//! type does not have, at its top or inside, is a 400 problem naming it — never ignored. Sent
//! as a mistaken client writes them; the same bodies with the fields' right names pass.

use messages::network::NetworkPolicy;
use messages::session::SessionRecord;

use crate::common::mesh::Mesh;
use crate::common::Gateway;

/// The refusal of a body: 400, `bad_request`, and a detail that starts with `names`.
fn refused(r: &crate::common::Reply, names: &str) {
    assert_eq!(r.status, 400, "{r:?}");
    let problem = r.problem();
    assert_eq!(problem.kind, "bad_request", "{problem:?}");
    assert!(
        problem.detail.starts_with(&format!("the body: {names}")),
        "{problem:?}"
    );
}

#[tokio::test]
async fn a_body_field_its_type_does_not_have_is_a_400_naming_it() {
    // Executor stand-ins: nothing here runs code, and what is refused never reaches one.
    let mesh = Mesh::builder()
        .tenants(&["acme"], &[])
        .risk()
        .workspace()
        .confirm_standin(false)
        .executor("node-a", 2)
        .scheduler(|c| c.network_ceiling = NetworkPolicy::ceiling("pkgs.example.org", "").unwrap())
        .start()
        .await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("acme");
    let post = |path: &'static str, body: serde_json::Value| {
        let (gw, key) = (&gw, &key);
        async move { gw.json("POST", path, Some(key), &body).await }
    };

    let typo =
        serde_json::json!({"session_id": "typo-1", "network": {"allow": ["pkgs.example.org"]}});
    refused(
        &post("/api/v1/sessions", typo).await,
        "unknown field `allow` in `network` of `SessionOpen` (expected one of: allow_domains,",
    );
    let r = gw
        .send("GET", "/api/v1/sessions/typo-1", Some(&key), &[], "")
        .await;
    assert_eq!(r.status, 404, "the refused open opened nothing: {r:?}");
    refused(
        &post(
            "/api/v1/execute",
            serde_json::json!({"language": "python", "code": "print(1)", "netwrok": {}}),
        )
        .await,
        "unknown field `netwrok` in `ExecRequest`",
    );
    refused(
        &post(
            "/api/v1/test",
            serde_json::json!({"language": "python", "code": "x = 1", "tests": "def test(): pass",
                               "files": [{"path": "a.txt", "content": "", "mode": 420}]}),
        )
        .await,
        "unknown field `mode` in `files[0]` of `TestRequest`",
    );
    refused(
        &post(
            "/api/v1/sessions/typo-1/processes",
            serde_json::json!({"cmd": "true", "pty": {"cols": 80, "rows": 24, "colour": true}}),
        )
        .await,
        "unknown field `colour` in `pty` of `ProcStart`",
    );
    refused(
        &post(
            "/api/v1/sessions/typo-1/ports",
            serde_json::json!({"port": 8000, "ttl": 60000}),
        )
        .await,
        "unknown field `ttl` in `ExposeBody` (expected one of: port, ttl_ms)",
    );
    assert!(mesh.runs.lock().unwrap().is_empty(), "nothing ran");

    // Positive control: the right name opens the session with its policy.
    let right = serde_json::json!({"session_id": "typo-1", "network": {"allow_domains": ["pkgs.example.org"]}});
    let r = post("/api/v1/sessions", right).await;
    assert_eq!(r.status, 201, "{r:?}");
    let opened: SessionRecord = r.json();
    assert_eq!(
        opened.network.map(|n| n.allow_domains),
        Some(vec!["pkgs.example.org".to_string()])
    );
    gw.stop().await;
    mesh.shutdown().await;
}
