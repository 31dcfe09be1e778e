//! Network policies at the scheduler: validated and clamped by the operator ceiling
//! `SANDMESH_NETWORK_ALLOW` on `exec` and `sessions.open`, carried to the executor in the run,
//! and a fetching program under a policy not held for confirmation.

use crate::common::*;
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, Tier, TierChoice};
use messages::executor::RunKind;
use messages::network::NetworkPolicy;
use messages::session::{SessionOpen, SessionRecord};
use messages::subjects::SessionOp;
use messages::{codec, Encoding, ErrorBody, ErrorKind, Subjects};

fn policy(json: serde_json::Value) -> NetworkPolicy {
    serde_json::from_value(json).unwrap()
}

fn fetching(network: Option<NetworkPolicy>, session: Option<&str>) -> ExecRequest {
    ExecRequest {
        language: Language::Python,
        code: "import urllib.request; urllib.request.urlopen('https://pkgs.example.org/')".into(),
        network,
        session_id: session.map(str::to_string),
        ..Default::default()
    }
}

async fn mesh(allow: &'static str) -> Mesh {
    Mesh::builder()
        .risk()
        .workspace()
        .confirm_standin(false)
        .executor("node-a", 8)
        .scheduler(move |c| {
            c.network_ceiling = NetworkPolicy::ceiling(allow, "").unwrap();
        })
        .start()
        .await
}

#[tokio::test]
async fn a_policy_beyond_the_ceiling_or_malformed_is_refused_before_anything_runs() {
    let mesh = mesh("pkgs.example.org *.files.example.org").await;
    let c = mesh.client.clone();
    let cases = [
        (
            policy(serde_json::json!({"allow_domains": ["pkgs.example.org", "evil.com"]})),
            ErrorKind::Denied,
            "allow_domains evil.com",
        ),
        (
            policy(serde_json::json!({"allow_all": true})),
            ErrorKind::Denied,
            "allow_all true",
        ),
        (
            policy(serde_json::json!({"allow_cidrs": ["10.0.0.0/8"]})),
            ErrorKind::Denied,
            "allow_cidrs 10.0.0.0/8",
        ),
        (
            policy(serde_json::json!({"allow_domains": ["*"]})),
            ErrorKind::BadRequest,
            "needs allow_all",
        ),
        (
            policy(serde_json::json!({"allow_domains": ["exa mple.com"]})),
            ErrorKind::BadRequest,
            "network.allow_domains[0]",
        ),
        (
            NetworkPolicy {
                allow_domains: (0..65).map(|i| format!("h{i}.files.example.org")).collect(),
                ..Default::default()
            },
            ErrorKind::BadRequest,
            "65 entries",
        ),
    ];
    for (network, kind, names) in cases {
        let e = mesh
            .exec(&fetching(Some(network.clone()), None))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.to_string().contains(names), "{e}");
        let open = SessionOpen {
            network: Some(network),
            ..Default::default()
        };
        let e = c
            .request::<_, SessionRecord>(Subjects::default().sessions(SessionOp::Open), &open)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), kind, "sessions.open: {e}");
    }
    let in_session = fetching(
        Some(policy(
            serde_json::json!({"allow_domains": ["pkgs.example.org"]}),
        )),
        Some("s1"),
    );
    let e = mesh.exec(&in_session).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadRequest, "{e}");
    assert!(
        mesh.runs.lock().unwrap().is_empty(),
        "nothing reached an executor"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_default_ceiling_permits_no_network_at_all() {
    let mesh = mesh("").await;
    let network = policy(serde_json::json!({"allow_domains": ["pkgs.example.org"]}));
    let e = mesh.exec(&fetching(Some(network), None)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Denied);
    assert!(
        e.to_string().contains("allow_domains pkgs.example.org"),
        "{e}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_admitted_policy_reaches_the_executor_and_fetching_under_it_needs_no_approval() {
    let mesh = mesh("pkgs.example.org,*.files.example.org !evil.files.example.org").await;
    let c = mesh.client.clone();
    // Without a policy, fetching code waits for a person (denied by the stand-in).
    let r: ExecResult = mesh.exec(&fetching(None, None)).await.unwrap();
    assert_eq!(
        r.error.unwrap().kind,
        ErrorKind::Denied,
        "confirmation denied"
    );
    let network = policy(serde_json::json!({"allow_domains": ["pkgs.example.org"]}));
    let r = mesh.exec(&fetching(Some(network), None)).await.unwrap();
    assert_eq!(r.error, None, "{r:?}");
    let session = SessionOpen {
        session_id: Some("net-1".into()),
        network: Some(policy(
            serde_json::json!({"allow_domains": ["dl.files.example.org"]}),
        )),
        ..Default::default()
    };
    let opened: SessionRecord = c
        .request(Subjects::default().sessions(SessionOp::Open), &session)
        .await
        .unwrap();
    let admitted = policy(serde_json::json!({
        "allow_domains": ["dl.files.example.org"],
        "deny_domains": ["evil.files.example.org"],
    }));
    assert_eq!(
        opened.network.as_ref(),
        Some(&admitted),
        "stored as admitted"
    );
    let r = mesh.exec(&fetching(None, Some("net-1"))).await.unwrap();
    assert_eq!(r.error, None, "the session's policy counts: {r:?}");
    let runs = mesh.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(
        runs[0].kind,
        RunKind::Isolated {
            session_grade: false
        },
        "never a warm pooled container"
    );
    assert_eq!(
        runs[0].network,
        Some(policy(serde_json::json!({
            "allow_domains": ["pkgs.example.org"],
            "deny_domains": ["evil.files.example.org"],
        })))
    );
    assert_eq!(
        runs[1].kind,
        RunKind::Session {
            session_id: "net-1".into()
        }
    );
    assert_eq!(runs[1].network, Some(admitted));
    mesh.shutdown().await;
}

/// Tier `aio` has no egress (its instances reach nothing), so a network policy there would be
/// moot: asked for with a policy, or in a session opened with one, the execution is refused
/// with 400 naming the policy — never run without it. (Code the real assessor sends to tier
/// aio is the aio-pool's tier tests' case.)
#[tokio::test]
async fn a_policy_tier_aio_cannot_apply_is_refused_naming_it() {
    let mesh = mesh("pkgs.example.org").await;
    let c = mesh.client.clone();
    let network = policy(serde_json::json!({"allow_domains": ["pkgs.example.org"]}));
    let session = SessionOpen {
        session_id: Some("net-aio".into()),
        network: Some(network.clone()),
        ..Default::default()
    };
    let _: SessionRecord = c
        .request(Subjects::default().sessions(SessionOp::Open), &session)
        .await
        .unwrap();
    let asked = ExecRequest {
        tier: TierChoice::Aio,
        ..fetching(Some(network), None)
    };
    let in_session = ExecRequest {
        tier: TierChoice::Aio,
        ..fetching(None, Some("net-aio"))
    };
    for req in [asked, in_session] {
        let r: ExecResult = mesh.exec(&req).await.unwrap();
        assert_eq!(
            (r.status, r.tier),
            (ExecStatus::Rejected, Tier::Aio),
            "{r:?}"
        );
        let e = r.error.expect("the refusal says why");
        assert_eq!(e.kind, ErrorKind::BadRequest, "{e:?}");
        assert!(e.message.contains("network policy"), "{e:?}");
        assert_eq!(e.details.as_ref().unwrap()["field"], "network", "{e:?}");
    }
    assert!(
        mesh.runs.lock().unwrap().is_empty(),
        "nothing reached an executor"
    );
    mesh.shutdown().await;
}

/// One request as a tenant's own NATS client sends it: `body` in `encoding`, with its
/// `Content-Type`. Answers the error code header (if any) and the decoded reply.
async fn ask(
    nc: &async_nats::Client,
    subject: String,
    body: &serde_json::Value,
    encoding: Encoding,
) -> (Option<String>, serde_json::Value) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(codec::CONTENT_TYPE, encoding.content_type());
    let reply = nc
        .request_with_headers(subject, headers, encoding.encode(body).unwrap().into())
        .await
        .unwrap();
    let code = reply
        .headers
        .as_ref()
        .and_then(|h| h.get(codec::SERVICE_ERROR_CODE))
        .map(|v| v.to_string());
    (code, encoding.decode(&reply.payload).unwrap())
}

/// A policy field the scheduler does not know is refused with 400 naming it, never ignored:
/// a client that wrote `allow` for `allow_domains` would otherwise get a session with no
/// network and no word of it. Sent as that client sends it, over a tenant's raw connection,
/// in both encodings; with the field's right name the same request opens the session.
#[tokio::test]
async fn a_misspelt_policy_field_is_refused_naming_it_not_ignored() {
    let mesh = Mesh::builder()
        .tenants(&["acme"], &[])
        .risk()
        .workspace()
        .confirm_standin(false)
        .executor("node-a", 8)
        .scheduler(|c| c.network_ceiling = NetworkPolicy::ceiling("pkgs.example.org", "").unwrap())
        .start()
        .await;
    let acme = test_support::connect(&mesh.nats.agent_url("acme")).await;
    let s = Subjects::default();
    for encoding in [Encoding::Json, Encoding::MsgPack] {
        let typo = serde_json::json!({
            "session_id": "typo-1",
            "network": {"allow": ["pkgs.example.org"]},
        });
        let (code, body) = ask(&acme, s.sessions(SessionOp::Open), &typo, encoding).await;
        assert_eq!(code.as_deref(), Some("400"), "{encoding:?}: {body}");
        let error: ErrorBody = serde_json::from_value(body).unwrap();
        assert_eq!(error.kind, ErrorKind::BadRequest);
        assert!(
            error
                .message
                .starts_with("unknown field `allow` in `network` of `SessionOpen`"),
            "{error:?}"
        );
        assert!(error.message.contains("allow_domains"), "{error:?}");
        assert_eq!(error.details.unwrap()["field"], "network.allow");

        let misspelt_top = serde_json::json!({
            "language": "python",
            "code": "print(1)",
            "netwrok": {"allow_domains": ["pkgs.example.org"]},
        });
        let (code, body) = ask(&acme, s.exec(), &misspelt_top, encoding).await;
        assert_eq!(code.as_deref(), Some("400"), "{encoding:?}: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("unknown field `netwrok` in `ExecRequest`"),
            "{body}"
        );
    }
    let (code, _) = ask(
        &acme,
        s.sessions(SessionOp::Get),
        &serde_json::json!({"session_id": "typo-1"}),
        Encoding::Json,
    )
    .await;
    assert_eq!(
        code.as_deref(),
        Some("404"),
        "the refused open opened nothing"
    );
    assert!(mesh.runs.lock().unwrap().is_empty(), "nothing ran");

    // Positive control: the same request with the field's right name.
    let right = serde_json::json!({
        "session_id": "typo-1",
        "network": {"allow_domains": ["pkgs.example.org"]},
    });
    let (code, body) = ask(&acme, s.sessions(SessionOp::Open), &right, Encoding::Json).await;
    assert_eq!(code, None, "{body}");
    let opened: SessionRecord = serde_json::from_value(body).unwrap();
    assert_eq!(
        opened.network.map(|n| n.allow_domains),
        Some(vec!["pkgs.example.org".to_string()])
    );
    mesh.shutdown().await;
}
