//! A session's background processes through the whole mesh (`proc.*`): the scheduler, a real
//! docker-executor node on real Docker, the real workspace-store and confirmation service, the
//! risk stand-in, over a real nats-server with the shipped tenant accounts.

use std::process::Command;
use std::time::Duration;

use crate::common::*;
use futures::StreamExt;
use messages::exec::{ContentEncoding, ExecRequest, ExecResult, ExecStatus, Language, Tier};
use messages::proc::*;
use messages::session::SessionOpen;
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
        tier: Tier::Session,
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
    client.exec().run(&req).await.expect("exec")
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
async fn a_terminal_echoes_its_input_and_takes_a_new_size() {
    let mesh = mesh().await;
    let acme = agent(&mesh, "acme").await;
    open(&acme, "tty").await;
    let mut shell = start("tty", argv(&["bash", "--norc", "-i"]));
    shell.pty = Some(PtySize { cols: 80, rows: 24 });
    let started = acme.procs().start(&shell, None).await.unwrap();
    let id = started.proc_id.clone();
    let typed = |line: &str| ProcInput {
        session_id: "tty".into(),
        proc_id: id.clone(),
        data: format!("{line}\n"),
        encoding: ContentEncoding::Utf8,
        eof: false,
        seq: None,
    };
    let shows = |needle: &'static str| {
        let (acme, id) = (acme.clone(), id.clone());
        async move {
            eventually(&format!("{needle:?} on the terminal"), || async {
                let out = read_all(&acme, "tty", &id, 0).await;
                let text = String::from_utf8_lossy(&bytes_of(&out.chunks)).into_owned();
                text.contains(needle).then_some(())
            })
            .await
        }
    };
    acme.procs().input(&typed("echo h''i")).await.unwrap();
    shows("\nhi\r\n").await;
    acme.procs().input(&typed("stty size")).await.unwrap();
    shows("24 80").await;
    acme.procs().resize("tty", &id, 100, 30).await.unwrap();
    acme.procs().input(&typed("stty size")).await.unwrap();
    shows("30 100").await;
    // Its end of input ends the shell.
    let eof = ProcInput {
        data: String::new(),
        eof: true,
        ..typed("")
    };
    acme.procs().input(&eof).await.unwrap();
    let info = ended(&acme, "tty", &id).await;
    assert_eq!(info.state, ProcState::Exited, "{info:?}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bombs_inside_a_background_process_are_held_by_the_sessions_limits() {
    let mesh = mesh().await;
    let acme = agent(&mesh, "acme").await;
    open(&acme, "bombs").await;
    // Control: the session runs code.
    let control = exec(&acme, "bombs", Language::Shell, "echo fine").await;
    assert_eq!(control.stdout.trim(), "fine", "{control:?}");
    let container = container_of("acme-bombs").remove(0);
    let limit: usize = String::from_utf8_lossy(
        &Command::new("docker")
            .args(["inspect", "-f", "{{.HostConfig.PidsLimit}}", &container])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .parse()
    .unwrap();

    let bomb = acme
        .procs()
        .start(
            &start("bombs", ProcCommand::Cmd("b(){ b|b& };b".into())),
            None,
        )
        .await
        .unwrap();
    // It reaches the pids limit and no further.
    eventually("the fork bomb at the pids limit", || async {
        (host_processes(&container).len() + 8 >= limit).then_some(())
    })
    .await;
    assert!(host_processes(&container).len() <= limit);
    acme.procs()
        .signal("bombs", &bomb.proc_id, ProcSignalKind::Kill)
        .await
        .unwrap();
    assert_eq!(
        ended(&acme, "bombs", &bomb.proc_id).await.state,
        ProcState::Killed
    );

    // An endless writer: the ring keeps its bound while it runs; the executor answers.
    let flood = acme
        .procs()
        .start(&start("bombs", argv(&["yes", "flood"])), None)
        .await
        .unwrap();
    let held = eventually("the ring dropping the flood's oldest output", || async {
        let req = ProcOutputRequest {
            session_id: "bombs".into(),
            proc_id: flood.proc_id.clone(),
            from_seq: 0,
            max_bytes: None,
        };
        let page = acme.procs().output(&req).await.ok()?;
        (page.dropped_before > 0).then_some(page)
    })
    .await;
    assert_eq!(held.state, ProcState::Running);
    assert!(bytes_of(&held.chunks).len() <= MAX_OUTPUT_REPLY_BYTES as usize);
    acme.procs()
        .signal("bombs", &flood.proc_id, ProcSignalKind::Term)
        .await
        .unwrap();
    assert_eq!(
        ended(&acme, "bombs", &flood.proc_id).await.state,
        ProcState::Killed
    );
    // The session came through both.
    let after = exec(&acme, "bombs", Language::Shell, "echo fine").await;
    assert_eq!(after.stdout.trim(), "fine", "{after:?}");
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
        body["signal"] = json!("KILL");
        assert_eq!(raw(op, body).await, Err(404), "{op:?}");
    }
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
