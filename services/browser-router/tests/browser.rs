//! browser-router end to end: real nats-server, real services, real Docker, real Chromium in
//! the browser image, a fixture site on 127.0.0.2 (see test_support::browser for why there).
//! Run with RUST_TEST_THREADS=1.

use std::time::Duration;

use messages::browser::{
    BrowserAction as A, BrowserBackend, BrowserCommand, BrowserPayload, BrowserRequest,
    ContentFormat,
};
use messages::confirm::ConfirmState;
use sandmesh_client::ErrorKind;
use test_support::browser::{req, typed, BrowserMesh, BOUND};
use test_support::eventually_true;

/// Width and height from a PNG's IHDR chunk (after the 8-byte signature and chunk header).
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&png[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&png[16..20]), be(&png[20..24]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn form_by_index_screenshot_back_wait_keys_scroll() {
    let mesh = BrowserMesh::start(&[]).await;
    let s = "form-session";

    let page = mesh.navigate(s, "/").await;
    assert_eq!(page.title.as_deref(), Some("Login"));
    assert_eq!(page.url.as_deref(), Some(mesh.fixture.url("/").as_str()));
    assert_eq!(page.backend, BrowserBackend::External);
    assert!(!page.state_lost);

    // elements → fill by index → click submit by index → the server got it.
    let listed = mesh.ok(s, A::Elements, BrowserPayload::default()).await;
    let names: Vec<_> = listed
        .elements
        .iter()
        .map(|e| (e.role.as_str(), e.name.as_str()))
        .collect();
    assert!(names.contains(&("textbox", "User name")), "{names:?}");
    assert!(names.contains(&("button", "Sign in")), "{names:?}");
    assert!(names.contains(&("link", "Late page")), "{names:?}");
    let user = mesh.index_of(s, |e| e.name == "User name").await;
    let submit = mesh.index_of(s, |e| e.name == "Sign in").await;
    let filled = mesh
        .ok(
            s,
            A::Fill,
            req(|r| {
                r.index = Some(user);
                r.text = Some("alice".into())
            }),
        )
        .await;
    assert!(
        filled.confirmation.is_none(),
        "a plain text field needs no person"
    );
    assert!(filled.risk_level.is_some());
    let clicked = mesh.ok(s, A::Click, req(|r| r.index = Some(submit))).await;
    assert_eq!(clicked.title.as_deref(), Some("Welcome"));
    assert!(mesh
        .text(s)
        .await
        .contains("server received user=alice&password="));
    assert_eq!(
        mesh.fixture.received.lock().unwrap().as_slice(),
        ["user=alice&password="]
    );

    // screenshot: a PNG of the viewport's size under artifacts/, inline only when asked.
    let shot = mesh.ok(s, A::Screenshot, BrowserPayload::default()).await;
    let path = shot.screenshot_path.expect("a path");
    assert!(
        path.starts_with("artifacts/") && path.ends_with(".png"),
        "{path}"
    );
    assert!(shot.screenshot_base64.is_none());
    let png = mesh
        .client
        .workspace()
        .read(s, &path)
        .await
        .expect("read the screenshot");
    assert_eq!(png_size(&png), browser_router::chromium::VIEWPORT);
    let inline = mesh.ok(s, A::Screenshot, req(|r| r.inline = true)).await;
    assert!(inline.screenshot_base64.is_some_and(|b| !b.is_empty()));

    // back: to the form again.
    let back = mesh.ok(s, A::Back, BrowserPayload::default()).await;
    assert_eq!(back.title.as_deref(), Some("Login"));

    // wait_for text that appears 700 ms after load; and one that never does.
    mesh.navigate(s, "/late").await;
    mesh.ok(s, A::WaitFor, req(|r| r.text = Some("arrived late".into())))
        .await;
    let never = mesh
        .act(
            s,
            A::WaitFor,
            req(|r| {
                r.text = Some("never there".into());
                r.ms = Some(300)
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(never.kind(), ErrorKind::Timeout, "{never}");

    // press_key on the focused field.
    mesh.navigate(s, "/keys").await;
    mesh.ok(s, A::Click, req(|r| r.selector = Some("#k".into())))
        .await;
    mesh.ok(s, A::PressKey, req(|r| r.key = Some("Enter".into())))
        .await;
    assert!(mesh.text(s).await.contains("pressed Enter"));

    // scroll: one screen down by default, then by an amount; a full-page shot is taller.
    mesh.navigate(s, "/long").await;
    let down = mesh.ok(s, A::Scroll, BrowserPayload::default()).await;
    assert_eq!(down.value.unwrap()["y"], 800);
    let more = mesh.ok(s, A::Scroll, req(|r| r.dy = Some(100))).await;
    assert_eq!(more.value.unwrap()["y"], 900);
    let full = mesh.ok(s, A::Screenshot, req(|r| r.full_page = true)).await;
    let png = mesh
        .client
        .workspace()
        .read(s, &full.screenshot_path.unwrap())
        .await
        .unwrap();
    let (w, h) = png_size(&png);
    // The layout width: the viewport less the vertical scrollbar of a long page.
    assert!((1200..=1280).contains(&w), "full page width {w}");
    assert!(h > 5000, "full page height {h}");

    let html = mesh
        .ok(s, A::Content, req(|r| r.format = ContentFormat::Html))
        .await;
    assert!(html.content.unwrap().contains("linear-gradient"));
    mesh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sessions_do_not_share_cookies_or_pages() {
    let mesh = BrowserMesh::start(&[]).await;
    for (s, who) in [("alice-s", "alice"), ("bob-s", "bob")] {
        mesh.navigate(s, "/").await;
        mesh.ok(
            s,
            A::Fill,
            req(|r| {
                r.selector = Some("#user".into());
                r.text = Some(who.into())
            }),
        )
        .await;
        mesh.ok(
            s,
            A::Click,
            req(|r| r.selector = Some("input[type=submit]".into())),
        )
        .await;
    }
    mesh.navigate("alice-s", "/me").await;
    mesh.navigate("bob-s", "/me").await;
    assert!(mesh.text("alice-s").await.contains("logged in as alice"));
    assert!(mesh.text("bob-s").await.contains("logged in as bob"));
    // A third session starts with no cookies at all, and each keeps its own page.
    mesh.navigate("carol-s", "/me").await;
    assert!(mesh.text("carol-s").await.contains("anonymous"));
    mesh.navigate("alice-s", "/late").await;
    let bob = mesh
        .ok("bob-s", A::Content, BrowserPayload::default())
        .await;
    assert_eq!(bob.title.as_deref(), Some("Me"));
    // One container per session (plus the warm one).
    assert_eq!(mesh.containers().len(), 4, "{:?}", mesh.containers());
    mesh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn password_fill_and_evaluate_wait_for_a_person() {
    let mesh = BrowserMesh::start(&[]).await;
    let s = "confirm-session";
    mesh.navigate(s, "/").await;
    let password = mesh
        .index_of(s, |e| e.input_type.as_deref() == Some("password"))
        .await;

    // Denied: refused, nothing typed.
    let (denier, mut denied) = mesh.decide_all(false).await;
    let e = mesh
        .act(
            s,
            A::Fill,
            req(|r| {
                r.index = Some(password);
                r.text = Some("hunter2".into())
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Denied, "{e}");
    assert!(e.to_string().contains("Denied"), "{e}");
    let id = denied.recv().await.expect("a confirmation was asked");
    let asked = mesh.client.confirm().get(&id).await.unwrap();
    assert!(
        !asked.code_excerpt.contains("hunter2"),
        "the secret is hidden: {}",
        asked.code_excerpt
    );
    assert!(asked.code_excerpt.contains("7 characters"));
    let e = mesh
        .act(
            s,
            A::Evaluate,
            req(|r| r.script = Some("document.title = 'changed'".into())),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Denied, "{e}");
    denier.abort();

    // Approved: done, and the reply names the decision.
    let (approver, _) = mesh.decide_all(true).await;
    let value = mesh
        .ok(
            s,
            A::Evaluate,
            req(|r| {
                r.script =
                    Some("[document.title, document.querySelector('#password').value]".into())
            }),
        )
        .await;
    assert_eq!(
        value.value.unwrap(),
        serde_json::json!(["Login", ""]),
        "the denied fill typed nothing"
    );
    assert_eq!(value.confirmation, Some(ConfirmState::Approved));
    let filled = mesh
        .ok(
            s,
            A::Fill,
            req(|r| {
                r.index = Some(password);
                r.text = Some("hunter2".into())
            }),
        )
        .await;
    assert_eq!(filled.confirmation, Some(ConfirmState::Approved));
    assert!(filled.confirmation_id.is_some());
    let typed = mesh
        .ok(
            s,
            A::Evaluate,
            req(|r| r.script = Some("document.querySelector('#password').value".into())),
        )
        .await;
    assert_eq!(typed.value.unwrap(), "hunter2");
    approver.abort();
    mesh.stop().await;
}

/// A tenant's agent that asks for notices (through the account's stream export of
/// `browser.*`) hears at once that its password fill waits for a person, with the
/// confirmation to approve; once an operator approves, the same call gets the done action.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_action_tells_its_caller_at_once() {
    let mesh = BrowserMesh::start(&[]).await;
    let agent = mesh.agent("default").await.browser();
    let s = "notice-session";
    let url = mesh.fixture.url("/");
    let opened = agent
        .act(&typed(
            A::Navigate,
            req(|r| {
                r.session_id = s.into();
                r.url = Some(url);
            }),
        ))
        .await
        .expect("navigate");
    assert!(opened.ok, "{opened:?}");
    // The agent's session (its id is scoped by its tenant): its elements, through the agent.
    let listed = agent
        .act(&typed(A::Elements, req(|r| r.session_id = s.into())))
        .await
        .expect("elements");
    let password = listed
        .elements
        .iter()
        .find(|e| e.input_type.as_deref() == Some("password"))
        .unwrap_or_else(|| panic!("no password field in {:?}", listed.elements))
        .index;

    let (tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let fill = req(|r| {
        r.session_id = s.into();
        r.index = Some(password);
        r.text = Some("hunter2".into());
    });
    let filler = agent.clone();
    let acting = tokio::spawn(async move {
        filler
            .act_notified(&typed(A::Fill, fill), move |notice| {
                let _ = tx.send(notice);
            })
            .await
    });
    let notice = tokio::time::timeout(BOUND, notices.recv())
        .await
        .expect("a notice before any decision")
        .expect("the notice");
    assert!(!acting.is_finished(), "the action waits for the decision");
    let pending = mesh
        .client
        .confirm()
        .get(&notice.confirmation_id)
        .await
        .unwrap();
    assert_eq!(pending.state, ConfirmState::Pending, "{pending:?}");
    assert_eq!(pending.expires_at, notice.expires_at);
    assert_eq!(
        pending.execution_id.as_deref(),
        Some(notice.execution_id.as_str())
    );
    assert!(
        !pending.code_excerpt.contains("hunter2"),
        "{}",
        pending.code_excerpt
    );

    let decide = messages::confirm::ConfirmDecide {
        id: notice.confirmation_id.clone(),
        approve: true,
        by: "operator".into(),
        reason: Some("the test approves".into()),
        scope: Default::default(),
        by_account: None,
    };
    mesh.client
        .confirm()
        .decide(&decide)
        .await
        .expect("approve");
    let filled = tokio::time::timeout(BOUND, acting)
        .await
        .expect("the action ends after the approval")
        .expect("task")
        .expect("the approved fill is done");
    assert_eq!(
        (filled.confirmation, filled.confirmation_id.as_deref()),
        (
            Some(ConfirmState::Approved),
            Some(notice.confirmation_id.as_str())
        )
    );
    assert!(notices.try_recv().is_err(), "one notice only");
    // Reading the field back is an `evaluate`: a person approves that too.
    let (approver, _) = mesh.decide_all(true).await;
    let read = req(|r| {
        r.session_id = s.into();
        r.script = Some("document.querySelector('#password').value".into());
    });
    let read = agent
        .act(&typed(A::Evaluate, read))
        .await
        .expect("evaluate");
    assert_eq!(read.value.unwrap(), "hunter2");
    approver.abort();
    mesh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_urls_and_bad_requests_get_clear_errors() {
    let mesh = BrowserMesh::start(&[]).await;
    let s = "refusals";
    let port = mesh.fixture.port;
    for (url, expect) in [
        ("file:///etc/passwd".to_string(), "file: URLs are refused"),
        ("chrome://settings".to_string(), "chrome: URLs are refused"),
        (
            "javascript:alert(1)".to_string(),
            "javascript: URLs are refused",
        ),
        (format!("http://localhost:{port}/"), "resolves to 127.0.0.1"),
        (format!("http://127.0.0.1:{port}/"), "127.0.0.1"),
        (
            format!("http://169.254.169.254:{port}/latest/meta-data/"),
            "169.254.169.254",
        ),
        (
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "port 80 not allowed",
        ),
    ] {
        let e = mesh
            .act(s, A::Navigate, req(|r| r.url = Some(url.clone())))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Denied, "{url}: {e}");
        assert!(e.to_string().contains(expect), "{url}: {e}");
    }
    // Nothing was started for refused navigations: only the warm browser exists.
    assert_eq!(mesh.containers().len(), 1);

    // A redirect from an allowed page to 127.0.0.1: the navigation check passed, the egress
    // proxy refuses the second hop and the fixture never sees it.
    // The answer is a refusal naming where it was redirected, not `ok` with the refused URL.
    let redirected = mesh
        .act(
            s,
            A::Navigate,
            req(|r| r.url = Some(mesh.fixture.url("/to-local"))),
        )
        .await
        .unwrap_err();
    assert_eq!(redirected.kind(), ErrorKind::Denied, "{redirected}");
    assert!(
        redirected.to_string().contains("redirected to"),
        "{redirected}"
    );
    let text = mesh.text(s).await;
    assert!(
        text.contains("resolves to 127.0.0.1"),
        "{redirected:?}: {text}"
    );
    // A download goes nowhere: the page stays where it was.
    mesh.navigate(s, "/").await;
    let download = req(|r| {
        r.url = Some(mesh.fixture.url("/download"));
        r.timeout_ms = Some(2000);
    });
    let e = mesh.act(s, A::Navigate, download).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::Timeout,
        "a download never loads a page: {e}"
    );
    let after = mesh.ok(s, A::Content, BrowserPayload::default()).await;
    assert_eq!(after.title.as_deref(), Some("Login"));

    // Bad input.
    let bad = |e: sandmesh_client::ClientError, kind: ErrorKind, text: &str| {
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.to_string().contains(text), "{e}");
    };
    let raw = |subject: &str, payload: Vec<u8>| {
        let nats = mesh.client.nats().clone();
        let subject = subject.to_string();
        async move {
            nats.request(subject, payload.into())
                .await
                .expect("a reply")
        }
    };
    let reply = raw(
        "sandbox.v1.browser.teleport",
        br#"{"session_id":"x"}"#.to_vec(),
    )
    .await;
    let body = String::from_utf8_lossy(&reply.payload).to_string();
    assert!(
        body.contains("unknown browser action \\\"teleport\\\""),
        "{body}"
    );
    let reply = raw("sandbox.v1.browser.navigate", b"{not json".to_vec()).await;
    assert_eq!(
        reply
            .headers
            .unwrap()
            .get("Nats-Service-Error-Code")
            .unwrap()
            .as_str(),
        "400"
    );
    let reply = raw("sandbox.v1.browser.navigate", vec![b'x'; 300 * 1024]).await;
    assert_eq!(
        reply
            .headers
            .unwrap()
            .get("Nats-Service-Error-Code")
            .unwrap()
            .as_str(),
        "413"
    );
    bad(
        mesh.act(s, A::Navigate, BrowserPayload::default())
            .await
            .unwrap_err(),
        ErrorKind::BadRequest,
        "navigate needs url",
    );
    bad(
        mesh.act(s, A::Click, BrowserPayload::default())
            .await
            .unwrap_err(),
        ErrorKind::BadRequest,
        "index (from elements) or selector",
    );
    bad(
        mesh.act("bad id!", A::Content, BrowserPayload::default())
            .await
            .unwrap_err(),
        ErrorKind::BadRequest,
        "session_id",
    );
    bad(
        mesh.act(
            s,
            A::Fill,
            req(|r| {
                r.selector = Some("#x".into());
                r.text = Some("y".repeat(65 * 1024))
            }),
        )
        .await
        .unwrap_err(),
        ErrorKind::TooLarge,
        "text is",
    );
    bad(
        mesh.act(s, A::Content, req(|r| r.is_research = true))
            .await
            .unwrap_err(),
        ErrorKind::Unavailable,
        "aio-pool",
    );
    // A selector that matches nothing, on a live page.
    mesh.navigate(s, "/").await;
    bad(
        mesh.act(s, A::Click, req(|r| r.selector = Some("#nope".into())))
            .await
            .unwrap_err(),
        ErrorKind::BadRequest,
        "no element matches #nope",
    );
    bad(
        mesh.act(s, A::Click, req(|r| r.index = Some(999)))
            .await
            .unwrap_err(),
        ErrorKind::BadRequest,
        "call elements again",
    );
    mesh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_browser_is_replaced_and_closing_removes_it() {
    let mesh = BrowserMesh::start(&[
        ("SANDMESH_BROWSER_WARM_POOL", "0"),
        ("SANDMESH_BROWSER_IDLE_MS", "3000"),
    ])
    .await;
    let s = "crashy";
    mesh.navigate(s, "/").await;
    let first = mesh.containers();
    assert_eq!(first.len(), 1);
    std::process::Command::new("docker")
        .args(["kill", &first[0]])
        .output()
        .unwrap();
    let again = mesh.navigate(s, "/me").await;
    assert!(again.state_lost, "the reply says the page state was lost");
    assert!(mesh.text(s).await.contains("anonymous"));
    let next = mesh.navigate(s, "/").await;
    assert!(!next.state_lost, "said once");
    eventually_true("the dead container is removed", BOUND, || async {
        let now = mesh.containers();
        now.len() == 1 && now[0] != first[0]
    })
    .await;

    // close: the container goes.
    mesh.ok(s, A::Close, BrowserPayload::default()).await;
    eventually_true("close removes the container", BOUND, || async {
        mesh.containers().is_empty()
    })
    .await;

    // The session closing (scheduler's sessions.close) removes it too.
    let opened = mesh
        .client
        .sessions()
        .open(&messages::session::SessionOpen::default())
        .await
        .unwrap();
    mesh.navigate(&opened.session_id, "/").await;
    assert_eq!(mesh.containers().len(), 1);
    mesh.client
        .sessions()
        .close(&opened.session_id)
        .await
        .unwrap();
    eventually_true("session close removes the container", BOUND, || async {
        mesh.containers().is_empty()
    })
    .await;

    // Idle: unused for SANDMESH_BROWSER_IDLE_MS, the browser is closed.
    mesh.navigate("idler", "/").await;
    assert_eq!(mesh.containers().len(), 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    eventually_true("an idle browser is closed", BOUND, || async {
        mesh.containers().is_empty()
    })
    .await;
    mesh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_actions_across_ten_sessions_leak_nothing() {
    let mesh = BrowserMesh::start(&[("SANDMESH_BROWSER_WARM_POOL", "2")]).await;
    let sessions: Vec<String> = (0..10).map(|i| format!("load-{i}")).collect();
    let runs = sessions.iter().map(|s| {
        let mesh = &mesh;
        async move {
            // 20 actions per session, 200 in all.
            for round in 0..4 {
                mesh.navigate(s, if round % 2 == 0 { "/" } else { "/long" })
                    .await;
                mesh.ok(s, A::Elements, BrowserPayload::default()).await;
                mesh.ok(s, A::Scroll, BrowserPayload::default()).await;
                mesh.ok(s, A::Content, BrowserPayload::default()).await;
                mesh.ok(s, A::Screenshot, BrowserPayload::default()).await;
            }
        }
    });
    futures::future::join_all(runs).await;
    assert_eq!(mesh.containers().len(), 12, "10 sessions + 2 warm");
    // Every container carries the mesh's label (leak accounting by one label finds browsers
    // too); there is no bridge: browsers have no network.
    let labelled = |kind: &str| {
        let out = std::process::Command::new("docker")
            .args([kind, "ls", "-q", "--filter"])
            .arg(format!("label=sandmesh.browser.router={}", mesh.router))
            .args(["--filter", "label=sandmesh.mesh"])
            .output()
            .expect("docker ls");
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    assert_eq!(labelled("container"), 12);
    assert_eq!(labelled("network"), 0, "a bridge of the router's");
    for s in &sessions {
        mesh.ok(s, A::Close, BrowserPayload::default()).await;
    }
    eventually_true("only the warm pool is left", BOUND, || async {
        mesh.containers().len() == 2
    })
    .await;
    let router = mesh.router.clone();
    mesh.stop().await;
    assert!(
        test_support::browser::containers_of(&router).is_empty(),
        "shutdown removes the warm pool"
    );
    let networks = std::process::Command::new("docker")
        .args(["network", "ls", "-q", "--filter"])
        .arg(format!("label=sandmesh.browser.router={router}"))
        .output()
        .expect("docker network ls");
    assert!(
        networks.stdout.is_empty(),
        "a bridge of the router's: {}",
        String::from_utf8_lossy(&networks.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_tenants_with_the_same_session_id_get_two_browsers() {
    let mesh = BrowserMesh::start_with_tenants(&["acme", "beta"], &[]).await;
    let mut agents = Vec::new();
    for (tenant, who) in [("acme", "alice"), ("beta", "bob")] {
        let agent = mesh.agent(tenant).await.browser();
        let act = |action, r: BrowserPayload| {
            let agent = agent.clone();
            async move {
                let r = BrowserPayload {
                    session_id: "s1".into(),
                    ..r
                };
                agent
                    .act(&typed(action, r))
                    .await
                    .expect("an agent's action")
            }
        };
        act(A::Navigate, req(|r| r.url = Some(mesh.fixture.url("/")))).await;
        act(
            A::Fill,
            req(|r| {
                r.selector = Some("#user".into());
                r.text = Some(who.into())
            }),
        )
        .await;
        act(
            A::Click,
            req(|r| r.selector = Some("input[type=submit]".into())),
        )
        .await;
        agents.push((agent, who));
    }
    for (agent, who) in agents {
        let me = BrowserPayload {
            session_id: "s1".into(),
            url: Some(mesh.fixture.url("/me")),
            ..Default::default()
        };
        agent.act(&typed(A::Navigate, me)).await.unwrap();
        let content = BrowserRequest::new(
            "s1",
            BrowserCommand::Content {
                format: ContentFormat::Text,
            },
        );
        let text = agent.act(&content).await.unwrap();
        assert!(text
            .content
            .unwrap()
            .contains(&format!("logged in as {who}")));
    }
    // Two sessions, two browsers (plus the warm one).
    assert_eq!(mesh.containers().len(), 3);
    mesh.stop().await;
}

/// A tenant's `browsers` quota, from the tenancy file the router follows: its
/// agent's second browser session is a 429 naming the quota (its first keeps working), another
/// tenant is not counted, and a closed browser frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_over_its_browsers_quota_gets_429() {
    let quota = messages::quota::Quotas {
        browsers: Some(1),
        ..Default::default()
    };
    let mesh = BrowserMesh::start_with_quotas(&["acme"], &[("acme", quota)], &[]).await;
    let (acme, other) = (
        mesh.agent("acme").await.browser(),
        mesh.agent("default").await.browser(),
    );
    let open = |session: &str| BrowserRequest {
        session_id: session.into(),
        ..BrowserRequest::new(
            "",
            BrowserCommand::Navigate {
                url: mesh.fixture.url("/"),
            },
        )
    };
    acme.act(&open("s1")).await.unwrap();
    let e = acme.act(&open("s2")).await.unwrap_err();
    let body = e.service_error().expect("the router refused");
    assert_eq!(e.kind(), ErrorKind::Overloaded, "{body:?}");
    let d = body.details.as_ref().unwrap();
    assert_eq!(d["quota"], "browsers", "{body:?}");
    assert_eq!(d["limit"], 1, "{body:?}");
    acme.act(&open("s1"))
        .await
        .expect("its own browser still serves");
    other.act(&open("s2")).await.expect("default is not acme");

    let close = BrowserRequest::new("s1", BrowserCommand::Close);
    acme.act(&close).await.unwrap();
    acme.act(&open("s2")).await.expect("closed: room again");
    mesh.stop().await;
}

/// A browser container reaches nothing on the host. As a renderer taken over would, code run
/// in the container as its own user (`docker exec`, with the image's own socat) knocks on every
/// host address the test read on the host side, on whatever its routes name, on its own
/// loopback, over TCP and UDP, while listeners of the test's own wait on the host's `0.0.0.0`
/// and `127.0.0.1`; and a page's script tries the same addresses with fetch, WebSocket and
/// WebRTC (a STUN server on each: UDP, which the proxy does not carry). Positive controls: the same
/// knock reaches Chromium's DevTools on the container's loopback, the page's fetch reaches the
/// fixture the policy allows, and the same knock from a container of the same image on a
/// normal Docker bridge reaches the host's listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_browser_container_reaches_nothing_on_the_host() {
    use test_support::hostnet::{self, HostListeners, GREETING};
    let listeners = HostListeners::start();
    let host = hostnet::host_addresses();
    let mesh = BrowserMesh::start(&[]).await;
    let s = "net-session";
    mesh.navigate(s, "/").await;
    let container = mesh.containers().into_iter().next().expect("a browser");

    let exec = |script: &str| {
        let out = std::process::Command::new("docker")
            .args(["exec", "-u", "10002:10002", &container, "sh", "-c", script])
            .output()
            .expect("docker exec");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"),
        "lo\n",
        "the container has an interface besides loopback"
    );
    // Gateways its routes name (none, with no interface): each is knocked on too.
    let routes = exec("cat /proc/net/route");
    let gateways = routes.lines().skip(1).filter_map(|l| {
        let gateway = u32::from_str_radix(l.split_whitespace().nth(2)?, 16).ok()?;
        (gateway != 0).then(|| std::net::IpAddr::from(gateway.to_le_bytes()))
    });
    let mut targets: Vec<String> = host
        .iter()
        .copied()
        .chain(gateways)
        .flat_map(|ip| {
            let at = match ip {
                std::net::IpAddr::V4(v4) => format!("TCP4:{v4}"),
                std::net::IpAddr::V6(v6) => format!("TCP6:[{v6}]"),
            };
            [listeners.any, listeners.loopback].map(|p| format!("{at}:{p}"))
        })
        .collect();
    targets.push(format!("TCP4:127.0.0.1:{}", listeners.any));
    targets.push(format!("TCP4:127.0.0.1:{}", listeners.loopback));
    let udp: Vec<String> = host
        .iter()
        .map(|ip| match ip {
            std::net::IpAddr::V4(v4) => format!("UDP4:{v4}:{}", listeners.udp),
            std::net::IpAddr::V6(v6) => format!("UDP6:[{v6}]:{}", listeners.udp),
        })
        .collect();
    // An HTTP request, the sending side held open a moment (DevTools answers nothing to a
    // request whose connection is already half closed); the host's listeners greet at once.
    let knock = |target: &str| {
        format!(
            "printf '%s ' {target}; (printf 'GET /json/version HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n'; \
             sleep 1) | socat -T3 - {target},connect-timeout=3 2>&1 | head -c 2000 | tr '\\n' ' '; echo"
        )
    };
    let script: Vec<String> = targets
        .iter()
        .map(|t| knock(t))
        .chain(
            udp.iter()
                .map(|t| format!("echo probe | socat -T1 - {t} 2>&1; echo {t} sent")),
        )
        .chain([knock("TCP4:127.0.0.1:9223")])
        .collect();
    let seen = exec(&script.join("\n"));
    // The knock sees a connection when there is one: Chromium's DevTools, inside.
    let own = seen
        .lines()
        .find(|l| l.starts_with("TCP4:127.0.0.1:9223"))
        .unwrap_or_default();
    assert!(own.contains("\"Browser\": \"Chrome/"), "{seen}");
    for target in &targets {
        let line = seen.lines().find(|l| l.starts_with(target.as_str()));
        let line = line.unwrap_or_else(|| panic!("{target} was not tried: {seen}"));
        assert!(
            !line.contains(GREETING),
            "{target} reached from the browser: {line}"
        );
    }
    assert_eq!(
        listeners.seen(),
        vec![],
        "the host's listeners were reached"
    );

    // A page's script: fetch, WebSocket and WebRTC to the host, fetch to the fixture.
    let urls: Vec<String> = host
        .iter()
        .map(|ip| match ip {
            std::net::IpAddr::V4(v4) => v4.to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        })
        .chain(["127.0.0.1".to_string()])
        .flat_map(|h| [listeners.any, listeners.loopback].map(|p| format!("{h}:{p}")))
        .collect();
    let stun: Vec<String> = host
        .iter()
        .map(|ip| match ip {
            std::net::IpAddr::V4(v4) => format!("stun:{v4}:{}", listeners.udp),
            std::net::IpAddr::V6(v6) => format!("stun:[{v6}]:{}", listeners.udp),
        })
        .collect();
    let script = format!(
        r#"(async () => {{
  const out = {{}};
  const fetched = async (url) => {{
    try {{ const r = await fetch(url, {{mode: 'no-cors'}}); return 'fetched ' + r.type; }}
    catch (e) {{ return 'error ' + e; }}
  }};
  out.fixture = await fetched({fixture});
  for (const at of {urls}) {{
    out['http://' + at] = await fetched('http://' + at + '/');
    out['ws://' + at] = await new Promise((done) => {{
      try {{
        const ws = new WebSocket('ws://' + at + '/');
        ws.onopen = () => done('open');
        ws.onerror = () => done('error');
        setTimeout(() => done('no answer'), 3000);
      }} catch (e) {{ done('error ' + e); }}
    }});
  }}
  const pc = new RTCPeerConnection({{iceServers: {stun}.map((urls) => ({{urls}}))}});
  pc.createDataChannel('probe');
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => setTimeout(done, 3000));
  out.rtc = pc.localDescription.sdp.includes('srflx') ? 'srflx' : 'no srflx';
  pc.close();
  return out;
}})()"#,
        fixture = serde_json::to_string(&mesh.fixture.url("/")).unwrap(),
        urls = serde_json::to_string(&urls).unwrap(),
        stun = serde_json::to_string(&stun).unwrap(),
    );
    let (approver, _) = mesh.decide_all(true).await;
    let page = mesh
        .ok(s, A::Evaluate, req(|r| r.script = Some(script)))
        .await;
    approver.abort();
    let page = page.value.expect("the script's value");
    // The script's requests go out: the fixture, which the policy allows, answers it. (What
    // the egress proxy answers for a refused address is a response too, so only the host's
    // listeners can tell whether the host was reached.)
    assert!(
        page["fixture"]
            .as_str()
            .is_some_and(|r| r.starts_with("fetched")),
        "{page:#}"
    );
    assert_eq!(page["rtc"], "no srflx", "{page:#}");
    assert_eq!(listeners.seen(), vec![], "reached from the page: {page:#}");

    // The positive control outside: the same knock from a container of the same image on
    // Docker's default bridge reaches the host's listener through that bridge's gateway.
    let gateway = hostnet::default_bridge_gateway();
    let target = format!("TCP4:{gateway}:{},connect-timeout=3", listeners.any);
    let out = hostnet::run_on_default_bridge(
        test_support::browser::image(),
        "10002:10002",
        "socat",
        &["-T3", "-", &target],
    );
    assert!(out.contains(GREETING), "{out:?}");
    let listeners = &listeners;
    eventually_true(
        "the host's listener saw the control's connection",
        BOUND,
        || async move {
            listeners
                .seen()
                .iter()
                .any(|(which, _)| *which == "tcp 0.0.0.0")
        },
    )
    .await;
    mesh.stop().await;
}
