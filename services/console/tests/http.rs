//! The console's HTTP edge, request by request: who gets in, what a cross-site or malformed
//! request gets, and that decisions are recorded as the operator who made them.

use crate::common::*;
use messages::confirm::ConfirmState;
use messages::tenancy::Tenant;
use sandmesh_auth::Role;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_operators_get_in_and_only_the_page_itself_may_post() {
    let mesh = start_mesh().await;
    let state = tempfile::tempdir().unwrap();
    let console = Console::start(&mesh.nats, "127.0.0.1:0".parse().unwrap(), state.path()).await;
    let http = console.http();

    // Unauthenticated: pages send to the login, the API and the stream answer 401, and no
    // decision is taken.
    let page = http.get("/", None).await;
    assert_eq!(
        (page.status, page.header("location")),
        (303, Some("/login"))
    );
    assert_eq!(http.get("/activity", None).await.status, 303);
    assert_eq!(http.get("/events", None).await.status, 401);
    assert_eq!(http.get("/api/whoami", None).await.status, 401);
    assert_eq!(
        http.post("/decide", None, "id=x&action=approve")
            .await
            .status,
        401
    );
    let forged = Session {
        cookie: "00".repeat(32),
        csrf: String::new(),
    };
    assert_eq!(http.get("/events", Some(&forged)).await.status, 401);
    let login = http.get("/login", None).await;
    assert_eq!(login.status, 200);
    assert!(login
        .header("content-security-policy")
        .is_some_and(|c| c.contains("script-src 'self'")));

    // NATS decides who the user is: a wrong password, an unknown user, and an agent (whose
    // password is right, but who is no operator) are all refused alike.
    let operator_pw = password(&mesh.nats, Role::Operator("operator"));
    let default = Tenant::default_tenant();
    let agent_user = mesh
        .nats
        .tenancy()
        .credentials(Role::Agent(&default))
        .unwrap()
        .clone();
    for (user, pw) in [
        ("operator", "wrong"),
        ("nobody", operator_pw.as_str()),
        (agent_user.user.as_str(), agent_user.password.as_str()),
    ] {
        let r = http
            .post("/login", None, &format!("user={user}&password={pw}"))
            .await;
        assert_eq!(r.status, 401, "{user}: {r:?}");
        assert!(r.header("set-cookie").is_none());
    }
    let empty = http.post("/login", None, "user=&password=").await;
    assert_eq!(empty.status, 400);
    let garbage = http.post("/login", None, "%%%").await;
    assert!(garbage.status >= 400 && garbage.status < 500, "{garbage:?}");

    let session = http.login("operator", &operator_pw).await;
    assert_eq!(
        http.get("/api/whoami", Some(&session)).await.body,
        "operator"
    );

    // Something to decide.
    let agent = agent(&mesh.nats).await;
    let request = python(RISKY, None);
    let exec_id = request.execution_id.clone().unwrap();
    let run = tokio::spawn({
        let agent = agent.clone();
        async move { agent.exec().exec(&request).await }
    });
    let watcher = operator(&mesh.nats, "operator").await;
    let pending = mesh::eventually("the confirmation", || {
        let watcher = watcher.clone();
        let exec_id = exec_id.clone();
        async move {
            let list = watcher.confirm().list(&Default::default()).await.ok()?;
            list.into_iter().find(|c| {
                c.execution_id
                    .as_deref()
                    .is_some_and(|e| e.ends_with(&exec_id))
            })
        }
    })
    .await;
    let approve = |csrf: &str| format!("csrf={csrf}&id={}&action=approve", pending.id);

    // Cross-site: no token, a wrong token, a foreign or missing Origin, a cross-site fetch —
    // all refused, and the confirmation is still pending.
    let no_token = http
        .post(
            "/decide",
            Some(&session),
            &format!("id={}&action=approve", pending.id),
        )
        .await;
    assert_eq!(no_token.status, 403, "{no_token:?}");
    let wrong = http
        .post("/decide", Some(&session), &approve(&"ab".repeat(32)))
        .await;
    assert_eq!(wrong.status, 403);
    let cookie = (
        "Cookie".to_string(),
        format!("sandmesh_console={}", session.cookie),
    );
    let host = ("Host".to_string(), http.host());
    for extra in [
        vec![("Origin".to_string(), "http://evil.example".to_string())],
        vec![],
        vec![
            ("Origin".to_string(), http.origin()),
            ("Sec-Fetch-Site".to_string(), "cross-site".to_string()),
        ],
    ] {
        let mut headers = vec![cookie.clone(), host.clone()];
        headers.extend(extra.clone());
        let r = http
            .send("POST", "/decide", &headers, &approve(&session.csrf))
            .await;
        assert_eq!(r.status, 403, "{extra:?}: {r:?}");
    }
    // A foreign Host (DNS rebinding) is not answered at all.
    let rebound = http
        .send(
            "GET",
            "/",
            &[("Host".into(), "evil.example:80".into()), cookie.clone()],
            "",
        )
        .await;
    assert_eq!(rebound.status, 421);
    // No state change through a GET.
    let by_get = http
        .get(
            &format!("/decide?{}", approve(&session.csrf)),
            Some(&session),
        )
        .await;
    assert_eq!(by_get.status, 405);
    let still = watcher.confirm().get(&pending.id).await.unwrap();
    assert_eq!(still.state, ConfirmState::Pending);

    // Malformed and hostile input: clear errors.
    let decide = |body: String| {
        let http = http.clone();
        let session = session.clone();
        async move { http.post("/decide", Some(&session), &body).await }
    };
    let csrf = &session.csrf;
    let deny_silently = decide(format!(
        "csrf={csrf}&id={}&action=deny&reason=+",
        pending.id
    ))
    .await;
    assert_eq!(deny_silently.status, 400, "{deny_silently:?}");
    assert!(deny_silently.body.contains("reason"));
    assert_eq!(
        decide(format!("csrf={csrf}&id={}&action=launch", pending.id))
            .await
            .status,
        400
    );
    assert_eq!(
        decide(format!("csrf={csrf}&id=..%2Fx&action=approve"))
            .await
            .status,
        400
    );
    assert_eq!(
        decide(format!(
            "csrf={csrf}&id=01NOSUCHCONFIRMATION&action=approve"
        ))
        .await
        .status,
        404
    );
    let long = "x".repeat(1001);
    assert_eq!(
        decide(format!(
            "csrf={csrf}&id={}&action=deny&reason={long}",
            pending.id
        ))
        .await
        .status,
        413
    );
    let huge = "x".repeat(64 * 1024);
    assert_eq!(
        decide(format!("csrf={csrf}&reason={huge}")).await.status,
        413
    );
    assert_eq!(
        http.get("/activity?session=..%2F..", Some(&session))
            .await
            .status,
        400
    );

    // The page's own post decides, as the operator who is logged in.
    let ok = decide(format!("{}&reason=checked", approve(csrf))).await;
    assert_eq!((ok.status, ok.header("location")), (303, Some("/")));
    let result = run.await.unwrap().unwrap();
    assert_eq!(
        result.confirmation.by.as_deref(),
        Some("operator"),
        "{result:?}"
    );
    // A page opened afterwards starts with it among the decided, saying who and how.
    let page = http.get("/", Some(&session)).await;
    let decided = page.body.split("id=\"decided\"").nth(1).unwrap_or_default();
    assert!(decided.contains(&pending.id), "{}", page.body);
    assert!(decided.contains("<b>Approved once</b> by <span class=\"by\">operator</span>"));
    let again = decide(approve(csrf)).await;
    assert_eq!(again.status, 409, "a second decision is refused: {again:?}");

    // The activity view shows the execution; a session's tail has its events.
    let activity = http.get("/activity", Some(&session)).await;
    assert_eq!(activity.status, 200);
    assert!(activity.body.contains(&exec_id), "{}", activity.body);
    // What ran, and its risk, joined from the execution's earlier events.
    assert!(activity.body.contains("<td>python ("), "{}", activity.body);
    assert!(
        activity.body.contains("<td>critical</td>"),
        "{}",
        activity.body
    );

    // Logging out needs the token too, and ends the login.
    assert_eq!(
        http.post("/logout", Some(&session), "csrf=nope")
            .await
            .status,
        403
    );
    let out = http
        .post("/logout", Some(&session), &format!("csrf={csrf}"))
        .await;
    assert_eq!(out.status, 303);
    assert_eq!(http.get("/api/whoami", Some(&session)).await.status, 401);

    console.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scoped_operator_sees_and_decides_only_its_tenants() {
    let mesh = mesh::Mesh::builder()
        .tenants(&["acme", "beta"], &[("alice", &["acme"])])
        .real_risk()
        .confirm(&[])
        .workspace()
        .executor("a", 8)
        .scheduler(|c| c.confirm_timeout = std::time::Duration::from_secs(600))
        .start()
        .await;
    let state = tempfile::tempdir().unwrap();
    let console = Console::start(&mesh.nats, "127.0.0.1:0".parse().unwrap(), state.path()).await;
    let http = console.http();
    let alice = http
        .login("alice", &password(&mesh.nats, Role::Operator("alice")))
        .await;
    let as_tenant = |t: &str| {
        let url = mesh.nats.agent_url(t);
        async move {
            let nc = test_support::connect(&url).await;
            sandmesh_client::MeshClient::new(nc, messages::Subjects::default()).with_timeout(BOUND)
        }
    };
    let acme = as_tenant("acme").await;
    let beta = as_tenant("beta").await;
    let mine = python(RISKY, None);
    let theirs = python(RISKY, None);
    acme.exec().submit(&mine).await.unwrap();
    beta.exec().submit(&theirs).await.unwrap();
    let admin = operator(&mesh.nats, "operator").await;
    let all = mesh::eventually("both confirmations", || {
        let admin = admin.clone();
        async move {
            let list = admin.confirm().list(&Default::default()).await.ok()?;
            (list.len() == 2).then_some(list)
        }
    })
    .await;
    let of = |exec: &messages::exec::ExecRequest| {
        let id = exec.execution_id.clone().unwrap();
        all.iter()
            .find(|c| c.execution_id.as_deref().is_some_and(|e| e.ends_with(&id)))
            .unwrap()
            .id
            .clone()
    };
    let (acme_id, beta_id) = (of(&mine), of(&theirs));
    let page = http.get("/", Some(&alice)).await;
    assert!(page.body.contains(&acme_id));
    assert!(!page.body.contains(&beta_id), "beta's confirmation leaked");
    let denied = http
        .post(
            "/decide",
            Some(&alice),
            &format!("csrf={}&id={beta_id}&action=approve", alice.csrf),
        )
        .await;
    assert_eq!(denied.status, 404, "{denied:?}");
    let theirs_now = admin.confirm().get(&beta_id).await.unwrap();
    assert_eq!(theirs_now.state, ConfirmState::Pending);
    // Her own tenant's she decides, recorded as herself.
    let approved = http
        .post(
            "/decide",
            Some(&alice),
            &format!("csrf={}&id={acme_id}&action=approve", alice.csrf),
        )
        .await;
    assert_eq!(approved.status, 303, "{approved:?}");
    let record = admin.confirm().get(&acme_id).await.unwrap();
    assert_eq!(record.state, ConfirmState::Approved);
    assert_eq!(record.by.as_deref(), Some("alice"));
    assert_eq!(record.by_account.as_deref(), Some("OPERATORS"));
    console.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_login_ends_at_its_expiry() {
    let mesh = mesh::Mesh::builder().confirm(&[]).start().await;
    let nats = &mesh.nats;
    let state = tempfile::tempdir().unwrap();
    let console = Console::start_with(nats, state.path(), |c| {
        c.session_ttl = std::time::Duration::from_secs(2)
    })
    .await;
    let http = console.http();
    let session = http
        .login("operator", &password(nats, Role::Operator("operator")))
        .await;
    assert_eq!(http.get("/api/whoami", Some(&session)).await.status, 200);
    test_support::eventually_true("the login to expire", BOUND, || async {
        http.get("/api/whoami", Some(&session)).await.status == 401
    })
    .await;
    assert_eq!(http.get("/", Some(&session)).await.status, 303);
    console.stop().await;
    mesh.shutdown().await;
}
