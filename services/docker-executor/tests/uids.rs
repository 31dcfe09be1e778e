//! A host uid per container: the kernel's per-user budgets (inotify instances, message-queue
//! bytes, pending signals) are never shared between two containers, so one tenant's code
//! holding all of them leaves another tenant's sandboxes theirs. The executor knows no
//! tenants: what stands between two tenants here is the container (a session of each, and the
//! warm pool's single-use containers), so that is what is attacked.

use std::time::Duration;

use bollard::query_parameters::InspectContainerOptions;
use docker_executor::docker::Sandboxes;
use messages::exec::{ExecResult, ExecStatus, Language};
use test_support::eventually;
use test_support::user_budgets::{self, Budgets};

use crate::common::{run, DockerRuns, Harness};

async fn kernel_cell(h: &Harness, session: &str, code: &str) -> ExecResult {
    let mut r = run(Some(session), Language::Python, code);
    r.edit_request(|r| r.kernel = true);
    h.call_node(&r).await.expect("kernel cell")
}

fn budgets(r: &ExecResult) -> Budgets {
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    Budgets::parse(&r.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_holding_every_per_user_budget_leaves_other_sandboxes_theirs() {
    let h = Harness::start().await;
    let nofile = 256; // SANDMESH_EXEC_NOFILE's default, which the harness keeps
    let (a, b) = ("tenant-a-kernel", "tenant-b-session");

    // Tenant A's kernel takes everything its uid may have, and keeps it between cells.
    let held = budgets(&kernel_cell(&h, a, user_budgets::HOLD).await);
    held.assert_exhausted(user_budgets::max_user_instances(), nofile);

    // Tenant B: a session container, a single-use warm container, and Node's file watcher.
    budgets(&h.session(b, Language::Python, user_budgets::TRY).await).assert_untouched();
    budgets(&h.ephemeral(Language::Python, user_budgets::TRY).await).assert_untouched();
    let watch = "const w = require('fs').watch('/tmp'); console.log('watching'); w.close()";
    let r = h.session(b, Language::Javascript, watch).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "watching\n"),
        "{r:?}"
    );

    // A held all of it the whole time: its own next try still fails.
    let still = budgets(&kernel_cell(&h, a, user_budgets::STILL_HELD).await);
    assert_eq!(still.inotify, held.inotify, "{still:?}");
    assert_eq!(still.mqueue, held.mqueue, "{still:?}");

    assert!(h.close(a).await && h.close(b).await);
    h.stop().await;
}

/// The host's view of a container: the uid and gid it was made with, and the `Uid:` and
/// `Gid:` lines of its init process's `/proc/<pid>/status`.
async fn host_ids(h: &Harness, name: &str) -> (String, String, String) {
    let inspect = h
        .backend
        .docker
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
        .expect("inspect");
    let user = inspect.config.and_then(|c| c.user).unwrap_or_default();
    let pid = inspect
        .state
        .and_then(|s| s.pid)
        .expect("a running container");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_default()
            .to_string()
    };
    (user, line("Uid:"), line("Gid:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_containers_run_as_two_host_uids_and_a_uid_returns_only_after_its_container_is_gone() {
    // Two uids of their own (beyond both backends' defaults, apart from other test runs'),
    // no warm container: the two sessions hold the whole range.
    let first = 2_000_300_000 + (std::process::id() % 100_000) * 2;
    let range = format!("{first}-{}", first + 1);
    let h = Harness::start_with(&[
        ("SANDMESH_EXEC_UIDS", &range),
        ("SANDMESH_EXEC_WARM_POOL", "0"),
        ("SANDMESH_EXEC_WARM_POOL_MAX", "0"),
        ("SANDMESH_EXEC_CAPACITY", "2"),
    ])
    .await;
    let uid_of = |r: ExecResult| -> u32 {
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
        r.stdout.trim().parse().expect("a uid")
    };
    let ua = uid_of(h.session("a", Language::Shell, "id -u").await);
    let ub = uid_of(h.session("b", Language::Shell, "id -u").await);
    assert_ne!(ua, ub, "two containers, two uids");
    let (name_a, name_b) = (
        h.session_container("a").await,
        h.session_container("b").await,
    );
    for (uid, name) in [(ua, &name_a), (ub, &name_b)] {
        assert!((first..=first + 1).contains(&uid), "{uid} of {range}");
        let ids = format!("\t{uid}\t{uid}\t{uid}\t{uid}");
        assert_eq!(
            host_ids(&h, name).await,
            (format!("{uid}:{uid}"), ids.clone(), ids),
            "{name}"
        );
    }

    // Every uid is out: a third session gets no container (rather than a shared uid).
    let e = h
        .call_node(&run(Some("c"), Language::Shell, "id -u"))
        .await
        .expect_err("no uid is free");
    assert!(e.to_string().contains("uid"), "{e}");

    // A's uid comes back only once A's container is gone: C gets it then, under its name.
    let gone = h
        .backend
        .docker
        .inspect_container(&name_a, None::<InspectContainerOptions>)
        .await
        .expect("inspect")
        .id
        .expect("an id");
    assert!(h.close("a").await);
    let uc = eventually(
        "session c to get a container",
        Duration::from_secs(30),
        || {
            let h = &h;
            async move {
                let r = h
                    .call_node(&run(Some("c"), Language::Shell, "id -u"))
                    .await
                    .ok()?;
                Some(uid_of(r))
            }
        },
    )
    .await;
    assert_eq!(uc, ua, "the only uid given back");
    let name_c = h.session_container("c").await;
    assert_eq!(name_c, Sandboxes::name_for_uid(ua));
    let old = h
        .backend
        .docker
        .inspect_container(&gone, None::<InspectContainerOptions>)
        .await;
    assert!(
        matches!(
            old,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })
        ),
        "A's container is gone: {old:?}"
    );
    assert!(h.close("b").await && h.close("c").await);
    h.stop().await;
}
