//! A host uid per sandbox: the kernel's per-user budgets (inotify instances, message-queue
//! bytes, pending signals) are charged to the uid the sandbox's user namespace belongs to on
//! the host, so one sandbox holding all of its own leaves every other sandbox theirs — another
//! tenant's run, on this node or another node of the host. Needs root (as the executor does to
//! give a sandbox any uid but its own).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use executor_node::UidPool;

use futures::StreamExt;
use messages::exec::{ExecStatus, Language, OutputChunk};
use test_support::user_budgets::{self, Budgets};
use test_support::{eventually, eventually_true};

use crate::common::{pooled, processes_in, request, BwrapRuns, Harness};
use crate::isolation::host_side_statuses;

/// Waits, inside the sandbox, until the test lets it go: until the host writes into the file
/// it made in its `/tmp` (writing to it, not creating one: a file the host's root made in the
/// sandbox's file system would belong to a uid its user namespace cannot map).
const UNTIL_RELEASED: &str = "import os, time\n\
    open('/tmp/gate', 'w').close()\n\
    while os.path.getsize('/tmp/gate') == 0:\n    time.sleep(0.02)\n";

/// Where bwrap nodes claim uids by default (`SANDMESH_BWRAP_UID_CLAIMS`).
const CLAIMS: &str = "/run/sandmesh/uids";

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the bwrap executor gives sandboxes uids of their own only as root: run the tests as root"
    );
}

/// Lets the node's `n` sandboxes that wait in [`UNTIL_RELEASED`] go on, once each has made its
/// gate: writes into it through `/proc/<pid>/root` of a process inside each (another mount
/// namespace than ours).
async fn release(node: &str, n: usize) {
    let ours = std::fs::read_link("/proc/self/ns/mnt").expect("own mount namespace");
    let mut opened = std::collections::HashSet::new();
    eventually_true("every gate opened", Duration::from_secs(30), || {
        for (pid, _) in processes_in(&format!("/{node}/")) {
            let Ok(mnt) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
                continue;
            };
            let gate = std::fs::OpenOptions::new()
                .append(true)
                .open(format!("/proc/{pid}/root/tmp/gate"));
            if mnt != ours && gate.and_then(|mut f| f.write_all(b"go")).is_ok() {
                opened.insert(mnt);
            }
        }
        let done = opened.len() >= n;
        async move { done }
    })
    .await;
}

fn uid_of(status: &str) -> u32 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
        .expect("a Uid line")
}

/// Every process on the host running as `uid`, by the cgroup it is in.
fn cgroups_of_uid(uid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        // A zombie holds nothing any more (and shows the root cgroup).
        let zombie = status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'));
        if uid_of(&status) == uid && !zombie {
            found.push(std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default());
        }
    }
    found.sort();
    found.dedup();
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_holding_every_per_user_budget_leaves_another_sandbox_its_own() {
    require_root();
    let h = Harness::start().await;
    let nofile = 256; // SANDMESH_EXEC_NOFILE's default, which the harness keeps
                      // Tenant A: takes everything, says so (streamed), holds it until released, then tries again.
    let code = format!(
        "{}{UNTIL_RELEASED}print('---')\n{}",
        user_budgets::HOLD,
        user_budgets::STILL_HELD
    );
    let mut hold = request(Language::Python, &code);
    hold.stream_output = true;
    hold.timeout_ms = Some(120_000);
    let hold = pooled(messages::new_id(), hold);
    let mut chunks = h
        .client
        .subscribe(h.subjects.output_any(&hold.execution_id))
        .await
        .unwrap();
    let attack = async {
        let mut said = String::new();
        // Until its last line has come whole: a chunk may end inside it ("fds " without the count).
        while !said
            .split_inclusive('\n')
            .any(|line| line.starts_with("fds ") && line.ends_with('\n'))
        {
            let m = tokio::time::timeout(Duration::from_secs(60), chunks.next())
                .await
                .expect("A reports what it holds")
                .expect("the output subscription");
            let c: OutputChunk = serde_json::from_slice(&m.payload).unwrap();
            assert!(!c.eof, "A ended before it said what it holds: {said:?}");
            said.push_str(&c.data);
        }
        let held = Budgets::parse(&said);
        held.assert_exhausted(user_budgets::max_user_instances(), nofile);

        // Tenant B, while A holds everything: a sandbox of its own gets one of each.
        let b = h.exec(Language::Python, user_budgets::TRY).await;
        assert_eq!(b.status, ExecStatus::Ok, "{b:?}");
        Budgets::parse(&b.stdout).assert_untouched();
        release(&h.node, 1).await;
        held
    };
    let (a, held) = tokio::join!(h.call_node(&hold), attack);
    // A held all of it the whole time: its own next try, after B's, still failed.
    let a = a.expect("A's run");
    assert_eq!(a.status, ExecStatus::Ok, "{a:?}");
    let (_, after) = a.stdout.split_once("---\n").expect("both reports");
    let still = Budgets::parse(after);
    assert_eq!(
        (still.inotify, still.mqueue),
        (held.inotify, held.mqueue),
        "{a:?}"
    );
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sandboxes_run_as_two_host_uids_and_no_node_hands_one_out_until_its_sandbox_is_gone() {
    require_root();
    // Two uids of their own (beyond both backends' defaults, apart from other test runs'),
    // for two nodes of this host: they claim them in the same directory (the default).
    let first = 2_000_600_000 + (std::process::id() % 100_000) * 2;
    let range = format!("{first}-{}", first + 1);
    let env = [
        ("SANDMESH_BWRAP_UIDS", range.as_str()),
        ("SANDMESH_BWRAP_CAPACITY", "2"),
    ];
    let one = Harness::start_with(&env).await;
    let other = Harness::start_with(&env).await;

    let waiting = || {
        let mut r = request(
            Language::Python,
            &format!("{UNTIL_RELEASED}print(os.getuid())"),
        );
        r.timeout_ms = Some(120_000);
        pooled(messages::new_id(), r)
    };
    let (first_run, second_run) = (waiting(), waiting());
    let needle = format!("/{}/", one.node);
    let watch = async {
        let uids = eventually("both sandboxes running", Duration::from_secs(60), || {
            let mut uids: Vec<u32> = host_side_statuses(&needle)
                .iter()
                .map(|(_, status)| uid_of(status))
                .collect();
            uids.sort();
            uids.dedup();
            async move { (uids.len() == 2).then_some(uids) }
        })
        .await;
        assert_eq!(
            uids,
            [first, first + 1],
            "two sandboxes, two host uids of the range"
        );
        for uid in &uids {
            let cgroups = cgroups_of_uid(*uid);
            assert_eq!(
                cgroups.len(),
                1,
                "uid {uid} in one sandbox only: {cgroups:?}"
            );
            assert!(cgroups[0].contains(&needle), "{cgroups:?}");
        }
        // While they run, the other node of the host has no uid of the range to give.
        let r = other.call_node(&waiting()).await.expect("an answer");
        let e = r
            .error
            .expect("every uid is held by the first node's sandboxes");
        assert_eq!(e.kind, messages::ErrorKind::Unavailable, "{e:?}");
        assert!(e.message.contains("no host uid"), "{e:?}");
        release(&one.node, 2).await;
        uids
    };
    let (r1, r2, uids) = tokio::join!(one.call_node(&first_run), one.call_node(&second_run), watch);
    for r in [r1, r2] {
        let r = r.expect("a waiting run");
        // Inside, the sandbox user is still the image's.
        assert_eq!(
            (r.status, r.stdout.as_str()),
            (ExecStatus::Ok, "10001\n"),
            "{r:?}"
        );
    }
    // Once those sandboxes are gone, both uids come free on the host (as a third node sees
    // them: it can claim both), and the other node gives one out.
    one.assert_clean().await;
    let third = UidPool::claimed_in(range.parse().unwrap(), Path::new(CLAIMS)).unwrap();
    eventually("both uids free", Duration::from_secs(30), || {
        let both = third.take().and_then(|a| third.take().map(|b| (a, b)));
        async move { both.ok().map(drop) }
    })
    .await;
    let other_needle = format!("/{}/", other.node);
    let watch = async {
        let seen = eventually("the other node's sandbox", Duration::from_secs(60), || {
            let seen = host_side_statuses(&other_needle);
            async move { seen.first().map(|(_, status)| uid_of(status)) }
        })
        .await;
        release(&other.node, 1).await;
        seen
    };
    let last = waiting();
    let (r, uid) = tokio::join!(other.call_node(&last), watch);
    let r = r.expect("the other node's run");
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert!(uids.contains(&uid), "{uid} of {range}");
    one.assert_recovered().await;
    other.stop().await;
    one.stop().await;
}
