//! A session's background processes through the whole mesh (`proc.*`): the scheduler, a real
//! docker-executor node on real Docker, the real workspace-store and confirmation service, the
//! risk stand-in, over a real nats-server with the shipped tenant accounts.

use std::process::Command;
use std::time::Duration;

use crate::common::*;
use futures::StreamExt;
use messages::audit::AuditDetails;
use messages::exec::{ContentEncoding, ExecRequest, ExecResult, ExecStatus, Language, Tier};
use messages::network::NetworkPolicy;
use messages::proc::*;
use messages::session::{CloseReason, SessionOpen, SessionState};
use messages::subjects::{ConfirmOp, ProcOp};
use messages::Subjects;
use sandmesh_client::{ErrorKind, MeshClient};

async fn mesh() -> Mesh {
    Mesh::builder()
        .risk()
        .confirm(&[])
        .real_workspace()
        .docker_executors(1)
        .tenants(&["acme", "beta"], &[])
        // A person has time to decide on a start.
        .scheduler(|c| c.confirm_timeout = Duration::from_secs(60))
        .start()
        .await
}

async fn agent(mesh: &Mesh, tenant: &str) -> MeshClient {
    let nats = connect(&mesh.nats.agent_url(tenant)).await;
    MeshClient::new(nats, Subjects::default()).with_timeout(Duration::from_secs(120))
}

async fn open(client: &MeshClient, id: &str) {
    let open = SessionOpen {
        session_id: Some(id.into()),
        tier: Some(Tier::Session),
        ..Default::default()
    };
    client
        .sessions()
        .open(&open)
        .await
        .expect("open the session");
}

fn start(session: &str, command: ProcCommand) -> ProcStart {
    ProcStart {
        session_id: session.into(),
        command,
        cwd: None,
        env: Default::default(),
        stdin: false,
        pty: None,
        tag: None,
        timeout_ms: 0,
        requested_by: None,
    }
}

fn argv(words: &[&str]) -> ProcCommand {
    ProcCommand::Argv(words.iter().map(|w| w.to_string()).collect())
}

async fn exec(client: &MeshClient, session: &str, language: Language, code: &str) -> ExecResult {
    let req = ExecRequest {
        session_id: Some(session.into()),
        language,
        code: code.into(),
        ..Default::default()
    };
    client.exec().exec(&req).await.expect("exec")
}

async fn state_of(client: &MeshClient, session: &str, proc_id: &str) -> Option<ProcInfo> {
    let procs = client.procs().list(session).await.ok()?;
    procs.into_iter().find(|p| p.proc_id == proc_id)
}

/// Every chunk of a process's kept output, from `from` on, page by page.
async fn read_all(client: &MeshClient, session: &str, proc_id: &str, from: u64) -> ProcOutput {
    let mut all = ProcOutput {
        chunks: Vec::new(),
        next_seq: from,
        dropped_before: 0,
        state: ProcState::Running,
    };
    loop {
        let req = ProcOutputRequest {
            session_id: session.into(),
            proc_id: proc_id.into(),
            from_seq: all.next_seq,
            max_bytes: None,
        };
        let page = client.procs().output(&req).await.expect("output");
        all.dropped_before = page.dropped_before;
        all.state = page.state;
        if page.chunks.is_empty() {
            return all;
        }
        all.next_seq = page.next_seq;
        all.chunks.extend(page.chunks);
    }
}

fn bytes_of(chunks: &[ProcChunk]) -> Vec<u8> {
    chunks.iter().flat_map(|c| c.bytes().unwrap()).collect()
}

/// Waits until the process ended; its state then.
async fn ended(client: &MeshClient, session: &str, proc_id: &str) -> ProcInfo {
    eventually(&format!("{proc_id} ended"), || async {
        let info = client
            .procs()
            .wait(session, proc_id, Duration::from_secs(5))
            .await
            .ok()?;
        (info.state != ProcState::Running).then_some(info)
    })
    .await
}

/// The session's container (one), as Docker names it.
fn container_of(session: &str) -> Vec<String> {
    test_support::mesh::docker::session_containers(session).expect("docker ps")
}

/// The command lines of the container's processes, read from the host (`docker top`).
fn host_processes(container: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["top", container, "-eo", "pid,args"])
        .output()
        .expect("docker top");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_background_server_answers_later_execs_and_dies_with_its_session() {
    let mesh = mesh().await;
    let acme = agent(&mesh, "acme").await;
    open(&acme, "web").await;
    let mut server = start("web", argv(&["python3", "-m", "http.server", "8000"]));
    server.tag = Some("web".into());
    let started = acme.procs().start(&server, None).await.expect("start");
    assert!(started.pid > 1);

    // A later execution in the session reaches it; its run's final sweep spares it, so the
    // next one does too — while a run's own daemon (the attacker's try) is still killed.
    let fetch = "import http.client, time\n\
                 for _ in range(100):\n\
                 \x20   try:\n\
                 \x20       c = http.client.HTTPConnection('127.0.0.1', 8000, timeout=2)\n\
                 \x20       c.request('GET', '/')\n\
                 \x20       print(c.getresponse().status)\n\
                 \x20       break\n\
                 \x20   except OSError:\n\
                 \x20       time.sleep(0.1)\n";
    let first = exec(&acme, "web", Language::Python, fetch).await;
    assert_eq!(
        (first.status, first.stdout.trim()),
        (ExecStatus::Ok, "200"),
        "{first:?}"
    );
    let daemon = exec(
        &acme,
        "web",
        Language::Shell,
        "(setsid sleep 777 &) ; echo left",
    )
    .await;
    assert_eq!(daemon.status, ExecStatus::Ok, "{daemon:?}");
    let second = exec(&acme, "web", Language::Python, fetch).await;
    assert_eq!(second.stdout.trim(), "200", "{second:?}");
    let containers = container_of("acme-web");
    assert_eq!(containers.len(), 1, "{containers:?}");
    let seen = host_processes(&containers[0]);
    assert!(seen.iter().any(|p| p.contains("http.server")), "{seen:?}");
    assert!(!seen.iter().any(|p| p.contains("sleep 777")), "{seen:?}");

    let listed = acme.procs().list("web").await.unwrap();
    let web = listed
        .iter()
        .find(|p| p.proc_id == started.proc_id)
        .unwrap();
    assert_eq!(
        (web.state, web.tag.as_deref()),
        (ProcState::Running, Some("web"))
    );

    // Killed through `signal`: `killed` once it is gone.
    let sleeper = acme
        .procs()
        .start(&start("web", argv(&["sleep", "1000"])), None)
        .await
        .unwrap();
    acme.procs()
        .signal("web", &sleeper.proc_id, ProcSignalKind::Kill)
        .await
        .unwrap();
    let info = ended(&acme, "web", &sleeper.proc_id).await;
    assert_eq!(
        (info.state, info.signal),
        (ProcState::Killed, Some(9)),
        "{info:?}"
    );
    // A process that exits by itself says its code.
    let done = acme
        .procs()
        .start(&start("web", ProcCommand::Cmd("exit 3".into())), None)
        .await
        .unwrap();
    let info = ended(&acme, "web", &done.proc_id).await;
    assert_eq!((info.state, info.exit_code), (ProcState::Exited, Some(3)));

    // The session ends: nothing of its container is left on the host.
    acme.sessions().close("web").await.unwrap();
    eventually("the session's container gone", || async {
        container_of("acme-web").is_empty().then_some(())
    })
    .await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_reattaches_byte_for_byte_and_a_flood_is_bounded_by_the_ring() {
    let mesh = mesh().await;
    let acme = agent(&mesh, "acme").await;
    open(&acme, "out").await;
    // It prints only once told to, so the live copy is subscribed before its first byte.
    let code = "import sys\nsys.stdin.readline()\n\
                for i in range(20000):\n    print('line', i, 'é' * (i % 7))\n\
                sys.stderr.write('done\\n')\n";
    let mut talker = start("out", argv(&["python3", "-c", code]));
    talker.stdin = true;
    let started = acme.procs().start(&talker, None).await.unwrap();
    let mut live = acme.procs().events(&started.proc_id).await.unwrap();
    let go = ProcInput {
        session_id: "out".into(),
        proc_id: started.proc_id.clone(),
        data: "go\n".into(),
        encoding: ContentEncoding::Utf8,
        eof: true,
        seq: Some(0),
    };
    assert_eq!(acme.procs().input(&go).await.unwrap().next_seq, 1);
    // A retry of the same seq is answered, not written twice.
    assert_eq!(acme.procs().input(&go).await.unwrap().next_seq, 1);
    let mut copy = Vec::new();
    let end = tokio::time::timeout(WAIT, async {
        while let Some(event) = live.next().await {
            match event.unwrap() {
                ProcEvent::Output(chunk) => copy.push(chunk),
                ProcEvent::Ended(info) => return info,
            }
        }
        panic!("the live events ended without the process's end");
    })
    .await
    .expect("the process's end, live");
    assert_eq!((end.state, end.exit_code), (ProcState::Exited, Some(0)));

    // Another connection, as a client that reconnected: from seq 0, the same bytes.
    let again = agent(&mesh, "acme").await;
    let kept = read_all(&again, "out", &started.proc_id, 0).await;
    assert_eq!(kept.dropped_before, 0);
    assert_eq!(kept.chunks, copy, "the kept copy differs from the live one");
    let text = String::from_utf8(bytes_of(&kept.chunks)).unwrap();
    assert!(
        text.contains("line 19999") && text.contains("done\n"),
        "{}",
        text.len()
    );
    // From any seq it still holds: the same suffix.
    let mid = copy[copy.len() / 2].seq;
    let tail = read_all(&again, "out", &started.proc_id, mid).await;
    assert_eq!(tail.chunks, copy[copy.len() / 2..]);

    // 10 MB of output: the ring keeps its bound and says what it dropped.
    let flood = "import sys\nfor _ in range(160):\n    sys.stdout.write('x' * 65536)\n";
    let big = acme
        .procs()
        .start(&start("out", argv(&["python3", "-c", flood])), None)
        .await
        .unwrap();
    ended(&acme, "out", &big.proc_id).await;
    let kept = read_all(&acme, "out", &big.proc_id, 0).await;
    let held = bytes_of(&kept.chunks).len();
    assert!(kept.dropped_before > 0, "nothing dropped");
    assert!(held <= OUTPUT_RING_BYTES, "{held} bytes kept");
    assert!(held > OUTPUT_RING_BYTES / 2, "only {held} bytes kept");
    assert_eq!(kept.chunks[0].seq, kept.dropped_before);
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_tenant_finds_no_process_and_a_risky_start_waits_for_a_person() {
    let mesh = mesh().await;
    let acme = agent(&mesh, "acme").await;
    let beta = agent(&mesh, "beta").await;
    open(&acme, "shared").await;
    let started = acme
        .procs()
        .start(&start("shared", argv(&["sleep", "1000"])), None)
        .await
        .unwrap();
    let id = started.proc_id.clone();

    // Positive control: acme sees, reads and signals it.
    assert!(state_of(&acme, "shared", &id).await.is_some());
    // beta, as a raw NATS client naming the same ids: 404 every time; the process runs on.
    let s = Subjects::default();
    let ids = ProcRef {
        session_id: "shared".into(),
        proc_id: id.clone(),
    };
    let output = ProcOutputRequest {
        session_id: "shared".into(),
        proc_id: id.clone(),
        from_seq: 0,
        max_bytes: None,
    };
    let signal = ProcSignal {
        session_id: "shared".into(),
        proc_id: id.clone(),
        signal: ProcSignalKind::Kill,
    };
    let not_found =
        |e: sandmesh_client::ClientError| assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    not_found(
        beta.request::<_, ProcList>(s.proc(ProcOp::List), &ids)
            .await
            .unwrap_err(),
    );
    not_found(
        beta.request::<_, ProcOutput>(s.proc(ProcOp::Output), &output)
            .await
            .unwrap_err(),
    );
    not_found(
        beta.request::<_, ProcInfo>(s.proc(ProcOp::Signal), &signal)
            .await
            .unwrap_err(),
    );
    // beta's own session of the same name holds none of acme's processes.
    open(&beta, "shared").await;
    assert!(beta.procs().list("shared").await.unwrap().is_empty());
    not_found(
        beta.request::<_, ProcInfo>(s.proc(ProcOp::Signal), &signal)
            .await
            .unwrap_err(),
    );
    let info = state_of(&acme, "shared", &id).await.unwrap();
    assert_eq!(info.state, ProcState::Running);

    // A start the risk policy wants a person for waits for the decision, then starts.
    let risky = start(
        "shared",
        argv(&["python3", "-c", "import os; os.system('sleep 1000')"]),
    );
    let waiting = {
        let acme = acme.clone();
        tokio::spawn(async move { acme.procs().start(&risky, None).await })
    };
    let operator = MeshClient::new(
        connect(&mesh.nats.operator_url("operator")).await,
        Subjects::default(),
    );
    let pending = eventually("the start's pending confirmation", || async {
        let list = messages::confirm::ConfirmList {
            limit: Some(100),
            ..Default::default()
        };
        let listed = operator.confirm().list(&list).await.ok()?;
        listed
            .into_iter()
            .find(|c| c.state == messages::confirm::ConfirmState::Pending)
    })
    .await;
    assert!(!waiting.is_finished(), "the start did not wait");
    assert_eq!(acme.procs().list("shared").await.unwrap().len(), 1);
    let decide = messages::confirm::ConfirmDecide {
        id: pending.id,
        approve: true,
        by: "operator".into(),
        reason: None,
        scope: messages::confirm::ConfirmScope::Once,
        by_account: None,
    };
    let _: messages::confirm::Confirmation = operator
        .request(s.confirm(ConfirmOp::Decide), &decide)
        .await
        .unwrap();
    let approved = waiting.await.unwrap().expect("the approved start");
    let info = state_of(&acme, "shared", &approved.proc_id).await.unwrap();
    assert_eq!(info.state, ProcState::Running);
    // The risk policy's refusal is final.
    let refused = acme
        .procs()
        .start(&start("shared", ProcCommand::Cmd("rm -rf /".into())), None)
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Denied);
    mesh.shutdown().await;
}

/// Waits until `session` closed, and checks it closed for its idle time.
async fn closed_as_idle(client: &MeshClient, session: &str) {
    let closed = eventually(&format!("{session} closed"), || async {
        let r = client.sessions().get(session).await.ok()?;
        (r.state == SessionState::Closed).then_some(r)
    })
    .await;
    assert_eq!(closed.close_reason, Some(CloseReason::Idle), "{closed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_process_keeps_its_session_open_past_its_idle_time() {
    let mesh = Mesh::builder()
        .risk()
        .confirm(&[])
        .real_workspace()
        .docker_executors(1)
        .tenants(&["acme"], &[])
        .scheduler(|c| c.sessions.sweep = Duration::from_millis(200))
        .start()
        .await;
    let acme = agent(&mesh, "acme").await;
    for id in ["held", "quiet"] {
        let open = SessionOpen {
            session_id: Some(id.into()),
            tier: Some(Tier::Session),
            idle_ms: Some(1500),
            // A run keeps its session busy until its deadline, finished or not; the start's
            // placing run too.
            timeout_ms: Some(2000),
            ..Default::default()
        };
        acme.sessions().open(&open).await.expect("open");
    }
    let sleeper = acme
        .procs()
        .start(&start("held", argv(&["sleep", "1000"])), None)
        .await
        .unwrap();
    // Control: the session without a process closes for its idle time.
    closed_as_idle(&acme, "quiet").await;
    // As long again past it, the session with a running process is open and its process runs.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let held = acme.sessions().get("held").await.unwrap();
    assert_eq!(held.state, SessionState::Active, "{held:?}");
    let info = state_of(&acme, "held", &sleeper.proc_id).await.unwrap();
    assert_eq!(info.state, ProcState::Running);
    assert_eq!(container_of("acme-held").len(), 1);
    // Once it ended, the idle time runs again.
    acme.procs()
        .signal("held", &sleeper.proc_id, ProcSignalKind::Kill)
        .await
        .unwrap();
    closed_as_idle(&acme, "held").await;
    eventually("its container gone", || async {
        container_of("acme-held").is_empty().then_some(())
    })
    .await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_fetches_after_the_run_ended_and_its_fetches_are_its_own() {
    use test_support::upstream;
    let web = upstream::http_server(|path, _| upstream::ok(&format!("upstream saw {path}"))).await;
    let ports = format!("80,{web}");
    let mesh = Mesh::builder()
        .risk()
        .confirm(&[])
        .real_workspace()
        .docker_executors(1)
        .tenants(&["acme"], &[])
        .scheduler(move |c| {
            c.network_ceiling = NetworkPolicy::ceiling("localhost,127.0.0.1/32", &ports).unwrap();
        })
        .start()
        .await;
    let acme = agent(&mesh, "acme").await;
    // The upstream lives on the host's loopback, reachable only through the policy's explicit
    // 127.0.0.1/32 (and `localhost`).
    let open = SessionOpen {
        session_id: Some("net".into()),
        tier: Some(Tier::Session),
        network: Some(NetworkPolicy {
            allow_domains: vec!["localhost".into()],
            allow_cidrs: vec!["127.0.0.1/32".into()],
            ports: Some(vec![web]),
            ..Default::default()
        }),
        ..Default::default()
    };
    acme.sessions().open(&open).await.expect("open");
    // Loopback is in NO_PROXY for a program's own servers; this upstream is the host's, so
    // the code sends it through the proxy explicitly.
    let fetch = |url: String| {
        format!(
            "import urllib.request\nurllib.request.proxy_bypass = lambda host: False\n\
             print(urllib.request.urlopen({url}, timeout=10).read().decode(), flush=True)\n"
        )
    };
    // The process fetches each path it is sent, from 127.0.0.1.
    let fetcher = format!(
        "import sys\nfor line in sys.stdin:\n    path = line.strip()\n    {}",
        fetch(format!("'http://127.0.0.1:{web}/' + path")).replace('\n', "\n    ")
    );
    let mut fetching = start("net", argv(&["python3", "-c", &fetcher]));
    fetching.stdin = true;
    let started = acme.procs().start(&fetching, None).await.unwrap();
    let ask = |path: &str, seq: u64| ProcInput {
        session_id: "net".into(),
        proc_id: started.proc_id.clone(),
        data: format!("{path}\n"),
        encoding: ContentEncoding::Utf8,
        eof: false,
        seq: Some(seq),
    };
    let answered = |needle: String| {
        let (acme, id) = (acme.clone(), started.proc_id.clone());
        async move {
            eventually(&format!("{needle:?} from the process"), || async {
                let out = read_all(&acme, "net", &id, 0).await;
                let text = String::from_utf8_lossy(&bytes_of(&out.chunks)).into_owned();
                text.contains(&needle).then_some(())
            })
            .await
        }
    };
    acme.procs().input(&ask("before-run", 0)).await.unwrap();
    answered("upstream saw /before-run".into()).await;

    // A run fetches through the run's relay, from localhost, and ends: its relay with it.
    let run = exec(
        &acme,
        "net",
        Language::Python,
        &fetch(format!("'http://localhost:{web}/from-run'")),
    )
    .await;
    assert_eq!(run.stdout.trim(), "upstream saw /from-run", "{run:?}");
    // After it, the process still gets its answer.
    acme.procs().input(&ask("after-run", 1)).await.unwrap();
    answered("upstream saw /after-run".into()).await;

    // Each decision is credited to whoever made the connection: the run's to the run, the
    // process's (before and after the run) to the process.
    let (process, ran) = (started.proc_id.clone(), run.execution_id.clone());
    // Execution ids may be stored scoped by the tenant (`acme-<id>`).
    let who = move |id: Option<String>| match id {
        Some(id) if id.ends_with(&process) => "the process".to_string(),
        Some(id) if id.ends_with(&ran) => "the run".to_string(),
        other => format!("{other:?}"),
    };
    let url = mesh.url.clone();
    let egress = eventually("three egress decisions audited", || {
        let (url, who) = (url.clone(), who.clone());
        async move {
            let seen: Vec<(String, String)> = audit_events(&url)
                .await
                .into_iter()
                .filter_map(|e| match e.details {
                    AuditDetails::EgressEvent(d) if d.allowed => {
                        Some((d.host, who(e.execution_id)))
                    }
                    _ => None,
                })
                .collect();
            (seen.len() >= 3).then_some(seen)
        }
    })
    .await;
    let pair = |host: &str, by: &str| (host.to_string(), by.to_string());
    assert_eq!(
        egress,
        vec![
            pair("127.0.0.1", "the process"),
            pair("localhost", "the run"),
            pair("127.0.0.1", "the process"),
        ],
    );
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_returns_what_a_running_process_wrote() {
    let mesh = mesh().await;
    let acme = agent(&mesh, "acme").await;
    open(&acme, "files").await;
    // Control: a run's file is read back (the run pushed it).
    let r = exec(&acme, "files", Language::Shell, "echo from-run > ran.txt").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(
        acme.workspace().read("files", "ran.txt").await.unwrap(),
        b"from-run\n"
    );
    // A process writes, says so, then waits for a line and rewrites the file and deletes the
    // run's; no run happens in between.
    let script = "echo first > notes.txt; echo wrote; read line; \
                  echo \"$line\" > notes.txt; rm ran.txt; echo rewrote; read line; \
                  echo third > third.txt; echo wrote-third; exec sleep 1000";
    let mut writer = start("files", ProcCommand::Cmd(script.into()));
    writer.stdin = true;
    let started = acme.procs().start(&writer, None).await.unwrap();
    let said = |needle: &'static str| {
        let (acme, id) = (acme.clone(), started.proc_id.clone());
        async move {
            eventually(&format!("the process saying {needle}"), || async {
                let out = read_all(&acme, "files", &id, 0).await;
                String::from_utf8_lossy(&bytes_of(&out.chunks))
                    .contains(needle)
                    .then_some(())
            })
            .await
        }
    };
    said("wrote").await;
    // Read at once, through the store: the process's bytes.
    assert_eq!(
        acme.workspace().read("files", "notes.txt").await.unwrap(),
        b"first\n"
    );
    let line = ProcInput {
        session_id: "files".into(),
        proc_id: started.proc_id.clone(),
        data: "second\n".into(),
        encoding: ContentEncoding::Utf8,
        eof: false,
        seq: None,
    };
    acme.procs().input(&line).await.unwrap();
    said("rewrote").await;
    assert_eq!(
        acme.workspace()
            .stat("files", "notes.txt")
            .await
            .unwrap()
            .size,
        7
    );
    assert_eq!(
        acme.workspace().read("files", "notes.txt").await.unwrap(),
        b"second\n"
    );
    assert!(!acme.workspace().exists("files", "ran.txt").await.unwrap());
    // Another tenant's read of the same name finds nothing, and syncs nothing of acme's.
    let beta = agent(&mesh, "beta").await;
    assert!(beta.workspace().read("files", "notes.txt").await.is_err());
    // An agent's write lands after what the process wrote: the next run (which refetches the
    // changed workspace) finds both.
    acme.procs()
        .input(&ProcInput {
            data: "go\n".into(),
            ..line
        })
        .await
        .unwrap();
    said("wrote-third").await;
    acme.workspace()
        .write("files", "agent.txt", b"agent\n")
        .await
        .unwrap();
    let r = exec(
        &acme,
        "files",
        Language::Shell,
        "cat notes.txt third.txt agent.txt",
    )
    .await;
    assert_eq!(r.stdout, "second\nthird\nagent\n", "{r:?}");
    // A process that wrote and ended before the read, with no run since: its bytes too.
    let quick = start("files", ProcCommand::Cmd("echo gone > exited.txt".into()));
    let quick = acme.procs().start(&quick, None).await.unwrap();
    let ended = acme
        .procs()
        .wait("files", &quick.proc_id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(ended.exit_code, Some(0), "{ended:?}");
    assert_eq!(
        acme.workspace().read("files", "exited.txt").await.unwrap(),
        b"gone\n"
    );
    // And the other way: a process started after an agent's upload, with no run between,
    // reads the upload.
    acme.workspace()
        .write("files", "uploaded.txt", b"from-agent\n")
        .await
        .unwrap();
    let reader = start("files", ProcCommand::Cmd("cat uploaded.txt".into()));
    let reader = acme.procs().start(&reader, None).await.unwrap();
    let ended = acme
        .procs()
        .wait("files", &reader.proc_id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(ended.exit_code, Some(0), "{ended:?}");
    let out = read_all(&acme, "files", &reader.proc_id, 0).await;
    assert_eq!(bytes_of(&out.chunks), b"from-agent\n");
    mesh.shutdown().await;
}

/// How many forks the session's pids limit refused so far, read from inside the session.
async fn pids_refused(client: &MeshClient, session: &str) -> u64 {
    let read = "cat /sys/fs/cgroup/pids/pids.events 2>/dev/null || cat /sys/fs/cgroup/pids.events";
    let r = exec(client, session, Language::Shell, read).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    r.stdout
        .split_whitespace()
        .skip_while(|w| *w != "max")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no max count in {:?}", r.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bombs_inside_a_background_process_are_held_by_the_sessions_limits() {
    let mesh = mesh().await;
    let acme = agent(&mesh, "acme").await;
    open(&acme, "bombs").await;
    // Control: the session runs code, and its limit has refused nothing yet.
    let refused_before = pids_refused(&acme, "bombs").await;
    let container = container_of("acme-bombs").remove(0);
    let inspect = Command::new("docker")
        .args(["inspect", "-f", "{{.HostConfig.PidsLimit}}", &container])
        .output()
        .unwrap();
    let limit: usize = String::from_utf8_lossy(&inspect.stdout)
        .trim()
        .parse()
        .unwrap();

    // A fork bomb whose leader lives on (`exec` needs no new pid): the process stays running
    // while its bomb holds the pids limit.
    let bomb = acme
        .procs()
        .start(
            &start(
                "bombs",
                ProcCommand::Cmd("b(){ b|b& }; b; exec sleep 1000".into()),
            ),
            None,
        )
        .await
        .unwrap();
    eventually("the fork bomb filling the container", || async {
        (host_processes(&container).len() * 2 >= limit).then_some(())
    })
    .await;
    assert!(host_processes(&container).len() <= limit);
    assert_eq!(
        state_of(&acme, "bombs", &bomb.proc_id).await.unwrap().state,
        ProcState::Running
    );
    acme.procs()
        .signal("bombs", &bomb.proc_id, ProcSignalKind::Kill)
        .await
        .unwrap();
    assert_eq!(
        ended(&acme, "bombs", &bomb.proc_id).await.state,
        ProcState::Killed
    );
    // Everything it forked is gone and reaped: the pids are free again.
    eventually("the bomb's processes gone", || async {
        (host_processes(&container).len() < 16).then_some(())
    })
    .await;
    let after = exec(&acme, "bombs", Language::Shell, "echo fine").await;
    assert_eq!(after.stdout.trim(), "fine", "{after:?}");
    assert!(
        pids_refused(&acme, "bombs").await > refused_before,
        "the pids limit never refused a fork"
    );

    // An endless writer: while it runs, the ring keeps its bound, says what it dropped, and a
    // page keeps the reply's bound; the session runs code and processes beside it.
    let flood = acme
        .procs()
        .start(&start("bombs", argv(&["yes", "flood"])), None)
        .await
        .unwrap();
    let page = |from_seq: u64, max_bytes: Option<u64>| ProcOutputRequest {
        session_id: "bombs".into(),
        proc_id: flood.proc_id.clone(),
        from_seq,
        max_bytes,
    };
    let held = eventually("the ring dropping the flood's oldest output", || async {
        let out = acme.procs().output(&page(0, None)).await.ok()?;
        (out.dropped_before > 0).then_some(out)
    })
    .await;
    assert_eq!(held.state, ProcState::Running);
    assert_eq!(held.chunks[0].seq, held.dropped_before);
    let bytes = bytes_of(&held.chunks);
    assert!(
        bytes.len() as u64 <= MAX_OUTPUT_REPLY_BYTES,
        "{}",
        bytes.len()
    );
    assert!(bytes.iter().all(|b| b"flood\n".contains(b)));
    let small = acme.procs().output(&page(0, Some(1))).await.unwrap();
    assert_eq!(small.chunks.len(), 1, "a page holds at least one chunk");
    let beside = exec(&acme, "bombs", Language::Shell, "echo beside").await;
    assert_eq!(beside.stdout.trim(), "beside", "{beside:?}");
    acme.procs()
        .signal("bombs", &flood.proc_id, ProcSignalKind::Term)
        .await
        .unwrap();
    assert_eq!(
        ended(&acme, "bombs", &flood.proc_id).await.state,
        ProcState::Killed
    );
    let kept = read_all(&acme, "bombs", &flood.proc_id, 0).await;
    let kept_bytes = bytes_of(&kept.chunks).len();
    assert!(kept_bytes <= OUTPUT_RING_BYTES, "{kept_bytes} bytes kept");
    assert_eq!(kept.chunks[0].seq, kept.dropped_before);

    // The session came through both: another process starts and says its piece.
    let again = acme
        .procs()
        .start(&start("bombs", argv(&["echo", "again"])), None)
        .await
        .unwrap();
    let info = ended(&acme, "bombs", &again.proc_id).await;
    assert_eq!((info.state, info.exit_code), (ProcState::Exited, Some(0)));
    let out = read_all(&acme, "bombs", &again.proc_id, 0).await;
    assert_eq!(bytes_of(&out.chunks), b"again\n");
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_requests_on_every_subject_get_a_clear_refusal() {
    let mesh = mesh().await;
    let acme = agent(&mesh, "acme").await;
    open(&acme, "hostile").await;
    let s = Subjects::default();
    let raw = |op: ProcOp, json: serde_json::Value| {
        let acme = acme.clone();
        async move {
            acme.request::<_, serde_json::Value>(Subjects::default().proc(op), &json)
                .await
                .map(|_| ())
                .map_err(|e| e.kind().code())
        }
    };
    use serde_json::json;
    // Bad ids, shapes and sizes.
    assert_eq!(
        raw(ProcOp::Start, json!({"session_id": "../x", "cmd": "true"})).await,
        Err(400)
    );
    assert_eq!(
        raw(ProcOp::Start, json!({"session_id": "hostile"})).await,
        Err(400)
    );
    assert_eq!(
        raw(ProcOp::Start, json!({"session_id": "hostile", "argv": []})).await,
        Err(400)
    );
    let many: Vec<String> = vec!["a".into(); MAX_ARGS + 1];
    assert_eq!(
        raw(
            ProcOp::Start,
            json!({"session_id": "hostile", "argv": many})
        )
        .await,
        Err(413)
    );
    let huge = "x".repeat(MAX_COMMAND_BYTES + 1);
    assert_eq!(
        raw(ProcOp::Start, json!({"session_id": "hostile", "cmd": huge})).await,
        Err(413)
    );
    let env = json!({"session_id": "hostile", "cmd": "true", "env": {"LD_PRELOAD": "/x.so"}});
    assert_eq!(raw(ProcOp::Start, env).await, Err(400));
    let pty = json!({"session_id": "hostile", "cmd": "true", "pty": {"cols": -1, "rows": 5}});
    assert_eq!(raw(ProcOp::Start, pty).await, Err(400));
    let wide = json!({"session_id": "hostile", "cmd": "true", "pty": {"cols": 5000, "rows": 5}});
    assert_eq!(raw(ProcOp::Start, wide).await, Err(400));
    // A program that does not exist: a clear 400.
    let missing = start("hostile", argv(&["/no/such/program"]));
    let e = acme.procs().start(&missing, None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadRequest, "{e}");

    // Unknown sessions and processes: 404, on every subject.
    let unknown = "01JD0000000000000000000009";
    let ids = json!({"session_id": "hostile", "proc_id": unknown});
    for op in [ProcOp::Output, ProcOp::Signal, ProcOp::Wait] {
        let mut body = ids.clone();
        if op == ProcOp::Signal {
            body["signal"] = json!("KILL");
        }
        assert_eq!(raw(op, body).await, Err(404), "{op:?}");
    }
    // A field the operation does not have is refused before anything is looked up.
    let mut stray = ids.clone();
    stray["signal"] = json!("KILL");
    assert_eq!(raw(ProcOp::Wait, stray).await, Err(400));
    let input = json!({"session_id": "hostile", "proc_id": unknown, "data": "x"});
    assert_eq!(raw(ProcOp::Input, input).await, Err(404));
    let resize = json!({"session_id": "hostile", "proc_id": unknown, "cols": 80, "rows": 24});
    assert_eq!(raw(ProcOp::Resize, resize).await, Err(404));
    let nobody = json!({"session_id": "nobody", "proc_id": unknown});
    assert_eq!(raw(ProcOp::List, nobody).await, Err(404));
    let bad_id = json!({"session_id": "hostile", "proc_id": "a.b"});
    assert_eq!(raw(ProcOp::Output, bad_id).await, Err(400));
    let negative = json!({"session_id": "hostile", "proc_id": unknown, "cols": -3, "rows": 2});
    assert_eq!(raw(ProcOp::Resize, negative).await, Err(400));
    let sig = json!({"session_id": "hostile", "proc_id": unknown, "signal": "STOP"});
    assert_eq!(raw(ProcOp::Signal, sig).await, Err(400));

    // On a live process: oversized and out-of-order input, a resize without a terminal.
    let mut cat = start("hostile", argv(&["cat"]));
    cat.stdin = true;
    let id = acme.procs().start(&cat, None).await.unwrap().proc_id;
    let big =
        json!({"session_id": "hostile", "proc_id": id, "data": "x".repeat(MAX_INPUT_BYTES + 1)});
    assert_eq!(raw(ProcOp::Input, big).await, Err(413));
    let ahead = json!({"session_id": "hostile", "proc_id": id, "data": "x", "seq": 5});
    assert_eq!(raw(ProcOp::Input, ahead).await, Err(409));
    let bad64 = json!({"session_id": "hostile", "proc_id": id, "data": "!!", "encoding": "base64"});
    assert_eq!(raw(ProcOp::Input, bad64).await, Err(400));
    let resize = json!({"session_id": "hostile", "proc_id": id, "cols": 80, "rows": 24});
    assert_eq!(raw(ProcOp::Resize, resize).await, Err(409));
    let long_wait = ProcWait {
        session_id: "hostile".into(),
        proc_id: id.clone(),
        timeout_ms: Some(u64::MAX),
    };
    // A wait is bounded however long it asks for: the process still runs.
    let info: ProcInfo = acme
        .request_timeout(
            s.proc(ProcOp::Wait),
            &long_wait,
            Duration::from_millis(MAX_WAIT_MS) + WAIT,
        )
        .await
        .unwrap();
    assert_eq!(info.state, ProcState::Running);
    mesh.shutdown().await;
}
