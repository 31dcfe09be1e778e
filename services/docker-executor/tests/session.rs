//! The session tier: one container per session, reused across its executions (files persist,
//! processes never do), never shared between sessions, closed on request or when idle, and
//! started from the warm pool so the first run pays no cold start.

use std::time::Duration;

use crate::common::{containers_with, run, DockerRuns, Harness};
use messages::exec::{ExecStatus, Language, Limits, Tier};
use messages::proc::{
    ProcCall, ProcCommand, ProcReply, ProcSignal, ProcSignalKind, ProcStart, ProcState,
};
use test_support::eventually_true;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_persists_within_a_session_and_never_crosses_sessions() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let a = "sess-a";
    let b = "sess-b";

    let r = h
        .session(
            a,
            Language::Shell,
            "echo kept > /workspace/note.txt\n\
             echo 41 > /tmp/counter\n\
             mkdir -p bin && printf '#!/bin/bash\\necho tool says $1\\n' > bin/tool && chmod +x bin/tool\n\
             sleep 1000 &\n\
             echo done",
        )
        .await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "done\n"),
        "{r:?}"
    );
    assert_eq!(r.tier, Tier::Session);
    let container = h.session_container(a).await;
    assert!(
        h.stray_processes(&container).await.is_empty(),
        "the background job died with its execution"
    );

    let r = h
        .session(
            a,
            Language::Python,
            "n = int(open('/tmp/counter').read()) + 1\n\
             open('/tmp/counter', 'w').write(str(n))\n\
             print(open('note.txt').read().strip(), n)",
        )
        .await;
    assert_eq!(r.stdout, "kept 42\n", "{r:?}");
    let r = h.session(a, Language::Shell, "./bin/tool hi").await;
    assert_eq!(r.stdout, "tool says hi\n", "{r:?}");
    assert_eq!(h.session_container(a).await, container, "one container");

    let r = h
        .session(
            b,
            Language::Shell,
            "ls -A /workspace; ls -A /tmp | grep -v '^.sandmesh$'; cat /tmp/counter 2>&1; \
             for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '[s]leep 1000'",
        )
        .await;
    assert_eq!(r.status, ExecStatus::Error, "grep found nothing: {r:?}");
    assert_eq!(
        r.stdout, "cat: /tmp/counter: No such file or directory\n0\n",
        "session b sees nothing of a: {r:?}"
    );
    assert_ne!(h.session_container(b).await, container);

    assert!(h.close(a).await);
    assert!(!h.close(a).await, "closing twice is harmless");
    h.wait_containers(1).await;
    let r = h
        .session(a, Language::Shell, "ls -A /workspace | wc -l")
        .await;
    assert_eq!(r.stdout, "0\n", "a closed session starts afresh");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_takes_a_warm_container() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "1")]).await;
    h.wait_warm(1).await;
    let warm = h.containers().await.remove(0);
    let r = h.session("sess-w", Language::Python, "print('warm')").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    // The pool refills; the session keeps the warm container it took.
    h.wait_containers(2).await;
    assert!(h.containers().await.contains(&warm));
    assert!(h.close("sess-w").await);
    h.wait_containers(1).await;
    assert!(
        !h.containers().await.contains(&warm),
        "the session's container went with it"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_closed_and_limits_follow_the_request() {
    let h = Harness::start_with(&[
        ("SANDMESH_EXEC_WARM_POOL", "0"),
        ("SANDMESH_EXEC_SESSION_IDLE_MS", "400"),
    ])
    .await;
    let mut req = run(
        Some("sess-idle"),
        Language::Shell,
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max",
    );
    req.edit_request(|r| {
        r.limits = Some(Limits {
            memory_mb: Some(96),
            pids: Some(40),
            ..Default::default()
        })
    });
    let r = h.call_node(&req).await.unwrap();
    assert_eq!(r.stdout, format!("{}\n40\n", 96u64 << 20), "{r:?}");
    // The next run asks for nothing: back to the defaults, in the same container.
    let container = h.session_container("sess-idle").await;
    let r = h
        .session(
            "sess-idle",
            Language::Shell,
            "cat /sys/fs/cgroup/pids/pids.max",
        )
        .await;
    assert_eq!(r.stdout, "128\n", "{r:?}");
    assert_eq!(h.session_container("sess-idle").await, container);

    eventually_true(
        "the idle session closed",
        Duration::from_secs(10),
        || async {
            containers_with(&h.backend.docker, "sandmesh.session=sess-idle")
                .await
                .is_empty()
        },
    )
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_finishes_running_work_closes_sessions_and_refuses_new_work() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let r = h
        .session("drain-s", Language::Python, "print('before')")
        .await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    // A run in flight when the drain arrives still finishes.
    let mut req = run(
        Some("drain-s"),
        Language::Shell,
        "echo started; sleep 0.5; echo finished",
    );
    req.edit_request(|r| r.stream_output = true);
    let mut chunks = h
        .client
        .subscribe(h.subjects.output_any(&req.execution_id))
        .await
        .unwrap();
    h.client.flush().await.unwrap();
    let slow = {
        let caller = h.caller.clone();
        let subject = h
            .subjects
            .executor_node(&h.node, messages::subjects::ExecutorOp::Run);
        tokio::spawn(async move {
            caller
                .request::<_, messages::exec::ExecResult>(subject, &req)
                .await
        })
    };
    tokio::time::timeout(
        Duration::from_secs(20),
        futures::StreamExt::next(&mut chunks),
    )
    .await
    .expect("the slow run started");
    let ack: messages::workspace::Ack = h
        .caller
        .request(
            h.subjects
                .executor_node(&h.node, messages::subjects::ExecutorOp::Drain),
            &messages::executor::ExecutorDrain {},
        )
        .await
        .unwrap();
    assert!(ack.ok);
    let r = slow.await.unwrap().unwrap();
    assert_eq!(r.stdout, "started\nfinished\n", "{r:?}");
    h.wait_containers(0).await;
    let refused = h
        .call(&run(None, Language::Python, "print(1)"))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), messages::ErrorKind::Unavailable);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_through_one_resident_supervisor_its_code_cannot_take_down() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "1")]).await;
    let s = "resident";
    // The shell's parent is the run's supervisor process; that one's parent is the container's
    // resident supervisor (`stat` field 4; its comm has no spaces).
    let resident = "cut -d' ' -f4 /proc/$PPID/stat";
    let first = h
        .session(
            s,
            Language::Shell,
            &format!("echo kept > /tmp/mark; {resident}"),
        )
        .await;
    let second = h.session(s, Language::Shell, resident).await;
    assert_eq!(first.status, ExecStatus::Ok, "{first:?}");
    assert!(first.stdout.trim().parse::<u32>().is_ok(), "{first:?}");
    assert_eq!(
        first.stdout, second.stdout,
        "one resident supervisor for both runs"
    );
    let container = h.session_container(s).await;

    // The code may kill it (same user): its own run still reports, and the next run of the
    // session starts another in the same container.
    let r = h
        .session(
            s,
            Language::Shell,
            &format!("kill -9 $({resident}); echo killed"),
        )
        .await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "killed\n"),
        "{r:?}"
    );
    let r = h
        .session(s, Language::Shell, &format!("cat /tmp/mark; {resident}"))
        .await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let (mark, pid) = r.stdout.split_once('\n').expect("two lines");
    assert_eq!(mark, "kept", "the same container: {r:?}");
    assert_ne!(pid, first.stdout, "a new resident supervisor: {r:?}");
    assert_eq!(h.session_container(s).await, container);
    assert!(h.stray_processes(&container).await.is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_every_process_loses_the_container_not_the_session() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let s = "kill-all";
    let r = h
        .session(s, Language::Shell, "echo kept > /workspace/f; echo ok")
        .await;
    assert_eq!(r.stdout, "ok\n");
    let before = h.session_container(s).await;
    // kill(-1) reaches the resident supervisor too (not the init): the container is lost.
    let r = h
        .hostile(Some(s), Language::Shell, "kill -9 -1; sleep 5", None)
        .await;
    assert_eq!(r.status, ExecStatus::Killed, "{r:?}");
    assert!(r.error.is_some(), "{r:?}");
    // The session goes on in a fresh container (its files live in the workspace-store when
    // sync is on; here, without it, they are gone with the container).
    let r = h.session(s, Language::Shell, "ls /workspace | wc -l").await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "0\n"),
        "{r:?}"
    );
    let after = h.session_container(s).await;
    assert_ne!(before, after);
    assert!(h.stray_processes(&after).await.is_empty());
    h.wait_containers(1).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_killed_from_outside_cost_a_retry_not_the_run() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "1")]).await;
    // A container that stopped before the kill landed is as dead as a killed one: what is
    // tested is that the run after it is retried, not that this kill won the race.
    let kill = |name: String| async move {
        let out = std::process::Command::new("docker")
            .args(["kill", &name])
            .output()
            .unwrap();
        let stopped = String::from_utf8_lossy(&out.stderr).contains("is not running");
        assert!(out.status.success() || stopped, "{out:?}");
    };
    // A warm container dies while it waits in the pool.
    h.wait_warm(1).await;
    let warm = h.containers().await.remove(0);
    kill(warm).await;
    let r = h.ephemeral(Language::Python, "print('retried')").await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "retried\n"),
        "{r:?}"
    );

    // A session's container dies between its runs.
    h.wait_warm(1).await;
    let r = h.session("killed-s", Language::Python, "print(1)").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    h.wait_warm(1).await;
    let owned = h.containers().await;
    // The session holds the container that is not the pool's fresh one: kill both, the
    // pool's refill comes back by itself.
    for name in owned {
        kill(name).await;
    }
    let r = h.session("killed-s", Language::Python, "print(2)").await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "2\n"),
        "{r:?}"
    );
    assert!(h.close("killed-s").await);
    h.stop().await;
}

/// One operation on the node's background processes, as the scheduler sends it.
async fn proc_call(h: &Harness, call: &ProcCall) -> ProcReply {
    let subject = h
        .subjects
        .executor_node(&h.node, messages::subjects::ExecutorOp::Proc);
    h.caller.request(subject, call).await.expect("proc call")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_process_keeps_its_container_past_the_idle_time() {
    let h = Harness::start_with(&[
        ("SANDMESH_EXEC_WARM_POOL", "0"),
        ("SANDMESH_EXEC_SESSION_IDLE_MS", "1500"),
    ])
    .await;
    let r = h.session("proc-held", Language::Shell, "true").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let start = ProcCall::Start {
        proc_id: messages::new_id(),
        tenant: None,
        output_subject: h.subjects.output(None, "proc-held-out"),
        start: ProcStart {
            session_id: "proc-held".into(),
            command: ProcCommand::Argv(vec!["sleep".into(), "1000".into()]),
            cwd: None,
            env: Default::default(),
            stdin: false,
            pty: None,
            tag: None,
            timeout_ms: 0,
            requested_by: None,
        },
    };
    let ProcReply::Started(started) = proc_call(&h, &start).await else {
        panic!("not started");
    };
    let container = h.session_container("proc-held").await;
    let r = h.session("proc-quiet", Language::Shell, "true").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let session_gone = |session: &'static str| {
        let docker = h.backend.docker.clone();
        move || {
            let docker = docker.clone();
            async move {
                containers_with(&docker, &format!("sandmesh.session={session}"))
                    .await
                    .is_empty()
            }
        }
    };
    // Control: the session without a process is closed for its idle time.
    eventually_true(
        "the quiet session closed",
        Duration::from_secs(10),
        session_gone("proc-quiet"),
    )
    .await;
    // Idle times later the container with a running process is still there, and so is the
    // process.
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert_eq!(h.session_container("proc-held").await, container);
    let list = ProcCall::List {
        session_id: "proc-held".into(),
    };
    let ProcReply::List(listed) = proc_call(&h, &list).await else {
        panic!("no list");
    };
    assert_eq!(listed.procs.len(), 1);
    assert_eq!(listed.procs[0].state, ProcState::Running);
    // Once it is killed, the idle close comes.
    let kill = ProcCall::Signal(ProcSignal {
        session_id: "proc-held".into(),
        proc_id: started.proc_id.clone(),
        signal: ProcSignalKind::Kill,
    });
    proc_call(&h, &kill).await;
    eventually_true(
        "the held session closed once its process ended",
        Duration::from_secs(10),
        session_gone("proc-held"),
    )
    .await;
    h.stop().await;
}
