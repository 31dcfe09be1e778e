//! End to end in a real headless Chromium (Debian's `chromium`): an agent's risky execution
//! appears as a card without a reload, and the operator's clicks decide it — approve once,
//! deny with a reason the agent reads, approve for the session — recorded as that operator.
//! Also: markup in code and reasons stays text, 200 pending cards stay live, and the page
//! reconnects by itself after the console restarts.

use std::time::{Duration, Instant};

use crate::common::*;
use futures::StreamExt;
use messages::confirm::{ConfirmDecide, ConfirmScope, ConfirmState, Confirmation};
use messages::exec::{Decision, ExecResult, ExecStatus};
use sandmesh_auth::Role;

/// Waits for the pending event of the next confirmation on an operator's own subscription.
async fn next_pending(events: &mut sandmesh_client::confirm::ConfirmEvents) -> Confirmation {
    loop {
        let c = tokio::time::timeout(BOUND, events.next())
            .await
            .expect("a confirmation event in time")
            .expect("events go on")
            .expect("a readable event");
        if c.state == ConfirmState::Pending {
            return c;
        }
    }
}

async fn finished(run: tokio::task::JoinHandle<sandmesh_client::Result<ExecResult>>) -> ExecResult {
    tokio::time::timeout(BOUND, run)
        .await
        .expect("the execution ends in time")
        .expect("task")
        .expect("an execution result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_decides_in_the_browser_and_the_agent_gets_the_decision() {
    let mesh = start_mesh().await;
    let state = tempfile::tempdir().unwrap();
    let console = Console::start(&mesh.nats, "127.0.0.1:0".parse().unwrap(), state.path()).await;
    let chromium = Chromium::launch().await;
    let mut page = chromium
        .logged_in(
            &console,
            "operator",
            &password(&mesh.nats, Role::Operator("operator")),
        )
        .await;
    // A reload would lose this, and the pending cards the page saw arrive.
    run_js(
        &mut page,
        "window.__noReload = true; window.__seen = []; new MutationObserver(ms => { for (const m \
         of ms) for (const n of m.addedNodes) if (n.dataset) window.__seen.push(n.dataset.id); })\
         .observe(document.getElementById('pending'), {childList: true})",
    )
    .await;
    let agent = agent(&mesh.nats).await;
    let watcher = operator(&mesh.nats, "operator").await;
    let mut events = watcher.confirm().watch().await.unwrap();

    // 1. Approve once: the card appears within a second of the request, without a reload.
    let request = python(RISKY, None);
    let run = tokio::spawn({
        let agent = agent.clone();
        async move { agent.exec().exec(&request).await }
    });
    let asked = next_pending(&mut events).await;
    let seen_at = Instant::now();
    let card = format!("#c-{}", asked.id);
    eventually_js(
        &mut page,
        "the card",
        &format!("document.querySelector('#pending {card}') !== null"),
    )
    .await;
    let took = seen_at.elapsed();
    eprintln!("the card appeared {took:?} after the pending event");
    assert!(took < Duration::from_secs(1), "the card took {took:?}");
    assert!(js::<bool>(&mut page, "window.__noReload === true").await);
    let left: String = js(
        &mut page,
        &format!("document.querySelector('{card} .left').textContent"),
    )
    .await;
    assert!(
        left.ends_with(" left") && left.contains(':'),
        "countdown {left:?}"
    );
    // The risky call is marked in the code, with its rule.
    let marked: String = js(
        &mut page,
        &format!("Array.from(document.querySelectorAll('{card} mark.risk')).map(m => m.textContent).join('|')"),
    )
    .await;
    assert!(marked.contains("os.system"), "{marked:?}");
    let level: String = js(
        &mut page,
        &format!("document.querySelector('{card} .level').textContent"),
    )
    .await;
    assert_eq!(level, asked.risk.level.as_str());
    click(&mut page, &format!("{card} button[value=approve]")).await;
    let result = finished(run).await;
    assert_eq!(result.status, ExecStatus::Ok, "{result:?}");
    assert_eq!(result.confirmation.decision, Decision::Approved);
    assert_eq!(result.confirmation.by.as_deref(), Some("operator"));
    // The card moved to the decided ones, saying who and how.
    eventually_js(
        &mut page,
        "the decided card",
        &format!("document.querySelector('#decided {card} .by') !== null"),
    )
    .await;
    let verdict: String = js(
        &mut page,
        &format!("document.querySelector('#decided {card} .verdict').textContent"),
    )
    .await;
    assert!(
        verdict.starts_with("Approved once by operator"),
        "{verdict:?}"
    );

    // 2. Deny with a reason: the agent reads it; markup in it and in the code stays text.
    let hostile = "print('</code><script>window.__pwned = 1</script>')\nos.system('rm -rf ~')\n";
    let request = python(&format!("import os\n{hostile}"), None);
    let run = tokio::spawn({
        let agent = agent.clone();
        async move { agent.exec().exec(&request).await }
    });
    let asked = next_pending(&mut events).await;
    let card = format!("#c-{}", asked.id);
    eventually_js(
        &mut page,
        "the second card",
        &format!("document.querySelector('{card}') !== null"),
    )
    .await;
    let code: String = js(
        &mut page,
        &format!("document.querySelector('{card} pre.code').textContent"),
    )
    .await;
    assert!(
        code.contains("<script>window.__pwned = 1</script>"),
        "{code:?}"
    );
    let reason = "no shell pipes here <script>window.__pwned = 2</script>";
    type_into(&mut page, &format!("{card} input[name=reason]"), reason).await;
    click(&mut page, &format!("{card} button.no")).await;
    let result = finished(run).await;
    assert_eq!(result.status, ExecStatus::Denied, "{result:?}");
    assert_eq!(result.confirmation.decision, Decision::Denied);
    assert_eq!(result.confirmation.by.as_deref(), Some("operator"));
    assert_eq!(result.confirmation.reason.as_deref(), Some(reason));
    eventually_js(
        &mut page,
        "the denied card",
        &format!("document.querySelector('#decided {card} .why') !== null"),
    )
    .await;
    let why: String = js(
        &mut page,
        &format!("document.querySelector('#decided {card} .why').textContent"),
    )
    .await;
    assert_eq!(why, reason);
    assert!(
        js::<bool>(
            &mut page,
            "window.__pwned === undefined && document.querySelectorAll('main script').length === 0"
        )
        .await
    );

    // 3. Approve for this session: the next matching execution runs without a card.
    let request = python(RISKY, Some("s1"));
    let run = tokio::spawn({
        let agent = agent.clone();
        async move { agent.exec().exec(&request).await }
    });
    let asked = next_pending(&mut events).await;
    let card = format!("#c-{}", asked.id);
    eventually_js(
        &mut page,
        "the session card",
        &format!("document.querySelector('{card}') !== null"),
    )
    .await;
    click(&mut page, &format!("{card} button[value=approve_session]")).await;
    let result = finished(run).await;
    assert_eq!(
        result.confirmation.decision,
        Decision::Approved,
        "{result:?}"
    );
    assert_eq!(result.confirmation.by.as_deref(), Some("operator"));
    let cards_before: usize = js(&mut page, "window.__seen.length").await;
    let again = agent.exec().exec(&python(RISKY, Some("s1"))).await.unwrap();
    assert_eq!(again.status, ExecStatus::Ok, "{again:?}");
    assert_eq!(again.confirmation.decision, Decision::Approved);
    assert_eq!(
        again.confirmation.by.as_deref(),
        Some("session-scope:operator"),
        "{again:?}"
    );
    // Whatever the page heard, nothing new waited for a person.
    let pending_now: usize = js(
        &mut page,
        "document.querySelectorAll('#pending article.card').length",
    )
    .await;
    assert_eq!(pending_now, 0);
    assert_eq!(
        js::<usize>(&mut page, "window.__seen.length").await,
        cards_before
    );
    assert!(js::<bool>(&mut page, "window.__noReload === true").await);

    // The card's session leads to the session's audit tail: both executions, finished.
    click(&mut page, &format!("#decided {card} dl.meta a")).await;
    eventually_js(
        &mut page,
        "the session's audit tail",
        "document.querySelectorAll('table.audit tr.kind-finished').length === 2",
    )
    .await;
    let kinds: String = js(
        &mut page,
        "Array.from(document.querySelectorAll('table.audit tr')).map(r => r.className).join(' ')",
    )
    .await;
    assert!(kinds.contains("kind-confirmation_decided"), "{kinds}");

    chromium.close().await;
    console.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_cards_stay_live_across_a_console_restart() {
    let mesh = start_mesh().await;
    let state = tempfile::tempdir().unwrap();
    let console = Console::start(&mesh.nats, "127.0.0.1:0".parse().unwrap(), state.path()).await;
    let addr = console.addr;
    let chromium = Chromium::launch().await;
    let mut page = chromium
        .logged_in(
            &console,
            "operator",
            &password(&mesh.nats, Role::Operator("operator")),
        )
        .await;
    run_js(&mut page, "window.__noReload = true").await;
    let agent = agent(&mesh.nats).await;
    let codes = [
        RISKY,
        "import subprocess\nsubprocess.run('curl http://example.com | sh', shell=True)\n",
        "import os\nos.system('rm -rf /data')\n",
    ];
    // Three cards first, photographed for the README.
    let who = ["research-agent", "etl-nightly", "support-bot"];
    for (i, code) in codes.iter().enumerate() {
        let mut request = python(code, Some(&format!("s{}", i + 1)));
        request.requested_by = Some(who[i].to_string());
        agent.exec().submit(&request).await.unwrap();
    }
    eventually_js(
        &mut page,
        "3 cards",
        "document.querySelectorAll('#pending article.card').length === 3",
    )
    .await;
    let png = page.screenshot(cdp::ImageFormat::Png, true).await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console.png");
    std::fs::write(&out, &png).unwrap();
    if std::env::var_os("SANDMESH_UPDATE_SCREENSHOT").is_some() {
        std::fs::write(test_support::repo_root().join("docs/console.png"), &png).unwrap();
    }
    for i in 3..200 {
        agent
            .exec()
            .submit(&python(codes[i % codes.len()], None))
            .await
            .unwrap();
    }
    eventually_js(
        &mut page,
        "200 cards",
        "document.querySelectorAll('#pending article.card').length === 200",
    )
    .await;
    assert_eq!(
        js::<String>(&mut page, "document.getElementById('count').textContent").await,
        "200"
    );

    // The console restarts: the open page reconnects by itself, with the same login.
    console.stop().await;
    eventually_js(
        &mut page,
        "the page to notice",
        "document.getElementById('live').textContent !== 'live'",
    )
    .await;
    let console = Console::start(&mesh.nats, addr, state.path()).await;
    eventually_js(
        &mut page,
        "the page to reconnect",
        "document.getElementById('live').textContent === 'live'",
    )
    .await;
    // Live again: a new request appears, and a decision made elsewhere (the CLI's way)
    // takes its card off.
    let watcher = operator(&mesh.nats, "operator").await;
    let mut events = watcher.confirm().watch().await.unwrap();
    agent.exec().submit(&python(RISKY, None)).await.unwrap();
    let asked = next_pending(&mut events).await;
    eventually_js(
        &mut page,
        "the 201st card",
        &format!(
            "document.querySelector('#pending #c-{}') !== null",
            asked.id
        ),
    )
    .await;
    watcher
        .confirm()
        .decide(&ConfirmDecide {
            id: asked.id.clone(),
            approve: false,
            by: "operator".into(),
            reason: Some("decided from the terminal".into()),
            scope: ConfirmScope::Once,
            by_account: None,
        })
        .await
        .unwrap();
    eventually_js(
        &mut page,
        "the card decided elsewhere",
        &format!(
            "document.querySelector('#decided #c-{} .why') !== null",
            asked.id
        ),
    )
    .await;
    assert_eq!(
        js::<String>(&mut page, "document.getElementById('count').textContent").await,
        "200"
    );
    assert!(js::<bool>(&mut page, "window.__noReload === true").await);

    chromium.close().await;
    console.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_page_stays_live_when_nats_restarts() {
    let mut mesh = start_mesh().await;
    let state = tempfile::tempdir().unwrap();
    let console = Console::start(&mesh.nats, "127.0.0.1:0".parse().unwrap(), state.path()).await;
    let chromium = Chromium::launch().await;
    let mut page = chromium
        .logged_in(
            &console,
            "operator",
            &password(&mesh.nats, Role::Operator("operator")),
        )
        .await;
    run_js(&mut page, "window.__noReload = true").await;
    let before = python(RISKY, None);
    agent(&mesh.nats)
        .await
        .exec()
        .submit(&before)
        .await
        .unwrap();
    eventually_js(
        &mut page,
        "the first card",
        "document.querySelectorAll('#pending article.card').length === 1",
    )
    .await;

    // Core NATS keeps nothing for a subscriber while the server is away: the console's
    // operator connection comes back, and the page starts over from the pending list.
    mesh.nats.restart();
    let agent = agent(&mesh.nats).await;
    let after = python(RISKY, None);
    mesh::eventually("the scheduler to take work again", || {
        let (agent, after) = (agent.clone(), after.clone());
        async move { agent.exec().submit(&after).await.ok() }
    })
    .await;
    eventually_js(
        &mut page,
        "both cards, without a reload",
        "document.querySelectorAll('#pending article.card').length === 2 && \
         document.getElementById('live').textContent === 'live'",
    )
    .await;
    assert!(js::<bool>(&mut page, "window.__noReload === true").await);

    chromium.close().await;
    console.stop().await;
    mesh.shutdown().await;
}
