//! The resource limits only this backend enforces its own way (pids,
//! tmpfs sizes, nofile, /dev/shm), against the bwrap backend: each limit pushed until it trips
//! (timeouts, output caps, memory bombs and orphans are the conformance suite's). Every
//! test checks the classified status, that the next execution works, and that no process or
//! cgroup of the node is left.

use std::time::Duration;

use crate::common::{request, BwrapRuns, Harness};
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, Limits};

fn limited(language: Language, code: &str, timeout_ms: u64, limits: Limits) -> ExecRequest {
    ExecRequest {
        timeout_ms: Some(timeout_ms),
        limits: Some(limits),
        ..request(language, code)
    }
}

fn pids_hit(r: &ExecResult) -> bool {
    r.error
        .as_ref()
        .and_then(|e| e.details.as_ref())
        .is_some_and(|d| d["pids_limit_hit"] == true)
}

#[tokio::test]
async fn fork_bombs_hit_the_pids_limit_and_another_run_still_forks() {
    let h = Harness::start().await;
    let pids = Limits {
        pids: Some(32),
        ..Default::default()
    };
    let shell = h.exec_with(limited(
        Language::Shell,
        ":(){ :|:& };:; sleep 5",
        1500,
        pids,
    ));
    // Same uid, another sandbox, at the same time: its own pids budget (no shared nproc).
    let other = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        h.exec(
            Language::Shell,
            "for i in 1 2 3 4 5; do (true); done; echo forked",
        )
        .await
    };
    let (bomb, other) = tokio::join!(shell, other);
    assert!(pids_hit(&bomb), "classified as the pids limit: {bomb:?}");
    assert_ne!(bomb.status, ExecStatus::Ok);
    assert_eq!(
        (other.status, other.stdout.as_str()),
        (ExecStatus::Ok, "forked\n"),
        "{other:?}"
    );
    let py = h
        .exec_with(limited(
            Language::Python,
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            1500,
            pids,
        ))
        .await;
    assert!(pids_hit(&py), "{py:?}");
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn tmpfs_pages_count_against_the_memory_limit() {
    // Memory bombs in the program are the conformance suite's; /dev/shm cannot hide memory
    // from the sandbox's cgroup either.
    let h = Harness::start().await;
    let mem = Limits {
        memory_mb: Some(64),
        ..Default::default()
    };
    let fill = |mb: u32| {
        limited(
            Language::Shell,
            &format!("dd if=/dev/zero of=/dev/shm/fill bs=1M count={mb} 2>&1; echo survived"),
            10_000,
            mem,
        )
    };
    // The control: a fill well under the limit is written and the program goes on, so the
    // bomb below is stopped by the limit, not by a /dev/shm that cannot be written at all.
    let small = h.exec_with(fill(8)).await;
    assert_eq!(small.status, ExecStatus::Ok, "{small:?}");
    assert_eq!(
        small.stdout.trim_end().lines().last(),
        Some("survived"),
        "{small:?}"
    );
    let r = h.exec_with(fill(256)).await;
    assert_eq!(r.status, ExecStatus::Oom, "{r:?}");
    assert_ne!(
        r.stdout.trim_end().lines().last(),
        Some("survived"),
        "{r:?}"
    );
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn filling_the_workspace_or_tmp_stops_at_their_size() {
    let h = Harness::start_with(&[
        ("SANDMESH_EXEC_WORKSPACE_MB", "16"),
        ("SANDMESH_EXEC_TMP_MB", "16"),
        ("SANDMESH_EXEC_FSIZE_MB", "8"),
    ])
    .await;
    // One big file: the fsize rlimit (SIGXFSZ) before the tmpfs is full.
    let r = h
        .exec(
            Language::Shell,
            "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1",
        )
        .await;
    assert_eq!(r.status, ExecStatus::Error, "{r:?}");
    assert_eq!(r.exit_code, Some(128 + 25), "SIGXFSZ: {r:?}");
    // Many small files: ENOSPC at the tmpfs size, in /workspace and in /tmp.
    for dir in ["/workspace", "/tmp"] {
        let code = format!(
            "for i in $(seq 1 40); do dd if=/dev/zero of={dir}/f$i bs=1M count=1 2>/dev/null || {{ echo full at $i; exit 1; }}; done"
        );
        let r = h.exec(Language::Shell, &code).await;
        assert_eq!(r.status, ExecStatus::Error, "{dir}: {r:?}");
        assert!(r.stdout.starts_with("full at"), "{dir}: {r:?}");
    }
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn file_descriptors_run_out_at_the_nofile_limit() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_NOFILE", "64")]).await;
    let code = "import errno\nfs = []\ntry:\n    while True: fs.append(open('/dev/null'))\n\
                except OSError as e:\n    print(len(fs), errno.errorcode[e.errno])";
    let r = h.exec(Language::Python, code).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let (count, err) = r.stdout.trim().split_once(' ').expect("count and errno");
    assert_eq!(err, "EMFILE");
    assert!(count.parse::<u32>().unwrap() < 64, "{r:?}");
    let r = h
        .exec(Language::Shell, "ulimit -n; ulimit -Hn; ulimit -c")
        .await;
    assert_eq!(
        r.stdout, "64\n64\n0\n",
        "nofile cannot be raised; no core dumps"
    );
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn a_run_that_makes_tens_of_thousands_of_files_and_odd_names_ends_with_its_own_status() {
    // A sandbox has no workspace, so its changes are neither kept nor listed: a report that
    // listed 60,000 new files would outgrow its frame, and the run would end `killed`.
    let h = Harness::start().await;
    let code = "import os\n\
                os.makedirs('bulk')\n\
                for i in range(60000):\n\
                \x20   open(f'bulk/file-{i:06}.dat', 'w').close()\n\
                for name in ['result.csv', 'weird\\nname.txt', 'back\\\\slash.txt', '%2e%2e%2fx']:\n\
                \x20   open(name, 'w').write('42')\n\
                print(len(os.listdir('bulk')), len(os.listdir('.')))";
    let r = h
        .exec_with(ExecRequest {
            timeout_ms: Some(60_000),
            ..request(Language::Python, code)
        })
        .await;
    // The files were made (the probe counts them), and the run ended as its program did.
    assert_eq!(
        (r.status, r.stdout.as_str(), &r.error),
        (ExecStatus::Ok, "60000 5\n", &None),
        "{r:?}"
    );
    assert!(
        r.files_created.is_empty() && r.files_refused.is_empty() && r.files_omitted == 0,
        "{r:?}"
    );
    h.assert_recovered().await;
    h.stop().await;
}
