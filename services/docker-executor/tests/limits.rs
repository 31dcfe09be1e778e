//! Limits, in session containers (which outlive their
//! runs): each pushes one limit until it trips and checks the classified status, that nothing
//! of the run is left, and that the next execution works. Timeouts are 2 s so the suite stays
//! fast. The same limits in single-use sandboxes are the conformance suite's
//! (`tests/conformance.rs`), run against every backend.

use crate::common::{run, DockerRuns, Harness};
use messages::exec::{ExecStatus, Language, Limits};
use messages::ErrorKind;

const POOL0: &[(&str, &str)] = &[("SANDMESH_EXEC_WARM_POOL", "0")];

fn pids(n: u64) -> Option<Limits> {
    Some(Limits {
        pids: Some(n),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb() {
    let h = Harness::start_with(POOL0).await;
    let s = "fork-bomb";
    // The shell classic (kept in the foreground): the pids cgroup stops it, the wall clock
    // ends it.
    let r = h
        .hostile_until_timeout(
            Some(s),
            Language::Shell,
            ":(){ :|:& };:\nsleep 1000",
            pids(32),
        )
        .await;
    assert!(
        matches!(r.status, ExecStatus::Timeout | ExecStatus::Error),
        "{r:?}"
    );
    let details = r
        .error
        .as_ref()
        .and_then(|e| e.details.clone())
        .unwrap_or_default();
    assert_eq!(
        details["pids_limit_hit"], true,
        "classified as the pids limit: {r:?}"
    );
    h.assert_recovered(Some(s), 0).await;

    // The Python loop sees EAGAIN at the limit; its sleeping children die with the run.
    let code = "import os, time\n\
        n = 0\n\
        try:\n\
        \x20   while True:\n\
        \x20       if os.fork() == 0:\n\
        \x20           time.sleep(60)\n\
        \x20           os._exit(0)\n\
        \x20       n += 1\n\
        except BlockingIOError as e:\n\
        \x20   print('EAGAIN', e.errno, n < 32)";
    let r = h.hostile(Some(s), Language::Python, code, pids(32)).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "EAGAIN 11 True\n"),
        "{r:?}"
    );
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb() {
    let h = Harness::start_with(POOL0).await;
    // The program, not its supervisor, is what the OOM killer picks first.
    let r = h
        .hostile(None, Language::Shell, "cat /proc/self/oom_score_adj", None)
        .await;
    assert_eq!(r.stdout.trim(), "1000", "{r:?}");
    let small = Some(Limits {
        memory_mb: Some(96),
        ..Default::default()
    });
    let s = "memory-bomb";
    let r = h
        .hostile(
            Some(s),
            Language::Python,
            "a = []\nwhile True:\n    a.append(b'x' * (16 << 20))",
            small,
        )
        .await;
    assert_eq!(r.status, ExecStatus::Oom, "{r:?}");
    assert_eq!(r.exit_code, Some(137));
    assert_eq!(r.error.as_ref().map(|e| e.kind), Some(ErrorKind::TooLarge));
    h.assert_recovered(Some(s), 0).await;
    assert!(h.close(s).await);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_burn_and_sleeper() {
    let h = Harness::start_with(POOL0).await;
    for (s, code) in [
        ("cpu-burn", "print('burning', flush=True)\nwhile True: pass"),
        ("sleeper", "import time\ntime.sleep(1e6)"),
    ] {
        let r = h
            .hostile_until_timeout(Some(s), Language::Python, code, None)
            .await;
        assert_eq!(r.status, ExecStatus::Timeout, "{s}: {r:?}");
        assert_eq!(r.error.as_ref().map(|e| e.kind), Some(ErrorKind::Timeout));
        if s == "cpu-burn" {
            assert_eq!(r.stdout, "burning\n", "output before the timeout is kept");
            assert!(r.usage.unwrap().cpu_ms > 0, "{r:?}");
        }
        h.assert_recovered(Some(s), 0).await;
        assert!(h.close(s).await);
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_escape() {
    let h = Harness::start_with(POOL0).await;
    let s = "orphans";
    // Double fork into a new session ignoring TERM, a re-parented grandchild, and an impostor
    // of the container's init: all die with the execution, though the parent exits at once.
    let escape =
        "setsid bash -c 'trap \"\" TERM HUP; exec sleep 1000' < /dev/null > /dev/null 2>&1 &\n\
        (setsid sh -c 'sleep 1001 & sleep 1002' &)\n\
        setsid /usr/local/bin/sandmesh-supervisor keep < /dev/null > /dev/null 2>&1 &\n\
        sleep 0.2\n\
        echo parent done";
    let r = h.hostile(Some(s), Language::Shell, escape, None).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "parent done\n"),
        "{r:?}"
    );
    h.assert_recovered(Some(s), 0).await;

    // The same, with the parent still running at the timeout.
    let r = h
        .hostile_until_timeout(
            Some(s),
            Language::Shell,
            &format!("{escape}\nsleep 1000"),
            None,
        )
        .await;
    assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    h.assert_recovered(Some(s), 0).await;
    assert!(h.close(s).await);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_bomb() {
    let h = Harness::start_with(POOL0).await;
    let cap = 64 * 1024;
    let limits = Some(Limits {
        max_output_bytes: Some(cap),
        ..Default::default()
    });
    let s = "stdout-bomb";
    let r = h.hostile(Some(s), Language::Shell, "yes", limits).await;
    assert_eq!(r.status, ExecStatus::OutputLimit, "{r:?}");
    assert!(r.stdout_truncated);
    assert_eq!(r.stdout.len() as u64, cap, "cut exactly at the cap");
    assert!(r.stdout.starts_with("y\ny\n"));
    h.assert_recovered(Some(s), 0).await;
    assert!(h.close(s).await);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_fill_workspace() {
    let h = Harness::start_with(&[
        ("SANDMESH_EXEC_WARM_POOL", "0"),
        ("SANDMESH_EXEC_WORKSPACE_MB", "32"),
        ("SANDMESH_EXEC_FSIZE_MB", "16"),
    ])
    .await;
    let s = "disk-fill";
    // The workspace tmpfs is full at its size...
    let r = h
        .hostile(
            Some(s),
            Language::Shell,
            "for i in 1 2 3; do head -c 15M /dev/zero > /workspace/f$i || exit 7; done",
            None,
        )
        .await;
    assert_eq!(
        (r.status, r.exit_code),
        (ExecStatus::Error, Some(7)),
        "{r:?}"
    );
    assert!(r.stderr.contains("No space left on device"), "{r:?}");
    // ...and one file cannot pass the fsize limit anywhere (SIGXFSZ).
    let r = h
        .hostile(
            Some(s),
            Language::Shell,
            "head -c 20M /dev/zero > /tmp/big",
            None,
        )
        .await;
    assert_eq!(r.status, ExecStatus::Error, "{r:?}");
    assert_eq!(r.exit_code, Some(128 + 25), "SIGXFSZ: {r:?}");
    h.assert_recovered(Some(s), 0).await;
    // Another session still writes.
    let r = h
        .session(
            "disk-other",
            Language::Shell,
            "head -c 10M /dev/zero > f && wc -c < f",
        )
        .await;
    assert_eq!(r.stdout, "10485760\n", "{r:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd_exhaustion() {
    let h = Harness::start_with(&[
        ("SANDMESH_EXEC_WARM_POOL", "0"),
        ("SANDMESH_EXEC_NOFILE", "128"),
    ])
    .await;
    let s = "fds";
    let code = "import os\nfds = []\ntry:\n    while True:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n\
        except OSError as e:\n    print(e.errno, len(fds) < 128)";
    let r = h.hostile(Some(s), Language::Python, code, None).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "24 True\n"),
        "EMFILE: {r:?}"
    );
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_abuse() {
    let h = Harness::start_with(POOL0).await;
    let s = "abuse";
    let mut req = run(
        Some(s),
        Language::Shell,
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max",
    );
    req.edit_request(|r| r.timeout_ms = Some(u64::MAX));
    req.edit_request(|r| {
        r.limits = Some(Limits {
            memory_mb: Some(1_000_000_000_000_000),
            cpus: Some(1e9),
            pids: Some(u64::MAX),
            max_output_bytes: Some(u64::MAX),
        })
    });
    let r = h.call(&req).await.unwrap();
    assert_eq!(r.status, ExecStatus::Ok, "clamped, not refused: {r:?}");
    assert_eq!(
        r.stdout,
        format!("{}\n512\n", 2048u64 << 20),
        "the ceilings hold"
    );
    let container = h.session_container(s).await;
    let inspect = h
        .backend
        .docker
        .inspect_container(
            &container,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    assert_eq!(inspect.host_config.unwrap().nano_cpus, Some(2_000_000_000));

    for (timeout, limits) in [
        (Some(0), None),
        (
            None,
            Some(Limits {
                memory_mb: Some(0),
                ..Default::default()
            }),
        ),
        (
            None,
            Some(Limits {
                cpus: Some(-1.0),
                ..Default::default()
            }),
        ),
        (
            None,
            Some(Limits {
                pids: Some(0),
                ..Default::default()
            }),
        ),
    ] {
        let mut bad = run(Some(s), Language::Python, "print(1)");
        bad.edit_request(|r| r.timeout_ms = timeout);
        bad.edit_request(|r| r.limits = limits);
        let e = h.call(&bad).await.unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::BadRequest,
            "{timeout:?} {limits:?}: {e}"
        );
    }
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_language() {
    let h = Harness::start_with(POOL0).await;
    let payload = serde_json::json!({
        "execution_id": messages::new_id(),
        "tier": "ephemeral",
        "request": {"language": "cobol", "code": "DISPLAY 'HI'."},
    });
    let reply = h
        .client
        .request(h.subjects.executor_run(), payload.to_string().into())
        .await
        .unwrap();
    let headers = reply.headers.expect("error headers");
    assert_eq!(
        headers.get("Nats-Service-Error-Code").unwrap().as_str(),
        "400"
    );
    let body: messages::ErrorBody = serde_json::from_slice(&reply.payload).unwrap();
    for lang in ["python", "javascript", "shell"] {
        assert!(
            body.message.contains(lang),
            "lists the supported languages: {body:?}"
        );
    }
    h.wait_containers(0).await;
    h.assert_recovered(None, 0).await;
    h.stop().await;
}
