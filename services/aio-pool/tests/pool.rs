//! aio-pool over real NATS and real Docker with the `sandmesh/aio` image.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{owned_containers, python, unique, Harness};
use messages::browser::{AioAcquire, AioExec, AioRelease};
use sandmesh_client::ErrorKind;
use test_support::{eventually, eventually_true};

fn acquire(session: &str) -> AioAcquire {
    AioAcquire {
        session_id: session.into(),
        browser: false,
    }
}

fn exec(session: &str, command: &str) -> AioExec {
    AioExec {
        session_id: session.into(),
        command: command.into(),
        timeout_ms: Some(20_000),
        instance_id: None,
    }
}

fn release(session: &str) -> AioRelease {
    AioRelease {
        session_id: session.into(),
        instance_id: None,
    }
}

#[tokio::test]
async fn acquire_exec_files_then_release_destroys_the_container() {
    let h = Harness::start(&[]).await;
    let lease = h.aio.acquire(&acquire("s1")).await.unwrap();
    assert!(lease.base_url.starts_with("http+unix://"), "{lease:?}");
    assert_eq!(h.containers().await, vec![lease.instance_id.clone()]);
    // The mesh-wide label, for leak accounting across every kind of container.
    let inspected = h
        .docker
        .inspect_container(&lease.instance_id, None)
        .await
        .unwrap();
    let labels = inspected.config.and_then(|c| c.labels).unwrap_or_default();
    assert!(labels.contains_key(containers::LABEL_MESH), "{labels:?}");

    let r = h
        .aio
        .exec_instance(&exec("s1", &python("print(1)")))
        .await
        .unwrap();
    assert_eq!(
        (r.status.as_str(), r.exit_code, r.stdout.as_str()),
        ("ok", Some(0), "1\n")
    );
    assert_eq!(r.instance_id, lease.instance_id);
    let r = h
        .aio
        .exec_instance(&exec(
            "s1",
            "mkdir -p out && echo hello > out/a.txt && echo err >&2; exit 3",
        ))
        .await
        .unwrap();
    assert_eq!(
        (r.status.as_str(), r.exit_code, r.stderr.as_str()),
        ("error", Some(3), "err\n")
    );
    // Files persist in the session's workspace between executions.
    let r = h
        .aio
        .exec_instance(&exec("s1", "pwd; cat out/a.txt"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "/home/gem\nhello\n");

    // Acquire again: the same instance while bound.
    let again = h.aio.acquire(&acquire("s1")).await.unwrap();
    assert_eq!(again.instance_id, lease.instance_id);

    let released = h.aio.release(&release("s1")).await.unwrap();
    assert_eq!(released.instance_id, lease.instance_id);
    let h_ref = &h;
    eventually_true(
        "the released container is removed",
        Duration::from_secs(20),
        || async move { h_ref.containers().await.is_empty() },
    )
    .await;
    // Exec on a released instance, and a second release: clear 404s.
    let e = h.aio.exec_instance(&exec("s1", "true")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("acquire one first"), "{e}");
    assert_eq!(
        h.aio.release(&release("s1")).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    // A new acquire of the same session gets a fresh instance, never the old one.
    let fresh = h.aio.acquire(&acquire("s1")).await.unwrap();
    assert_ne!(fresh.instance_id, lease.instance_id);
    let r = h
        .aio
        .exec_instance(&exec("s1", "ls out 2>&1 || true"))
        .await
        .unwrap();
    assert!(r.stdout.contains("No such file"), "{r:?}");
    h.stop().await;
}

#[tokio::test]
async fn two_sessions_never_share_files_processes_browser_or_network() {
    let h = Harness::start(&[]).await;
    let a = h
        .aio
        .acquire(&AioAcquire {
            session_id: "a".into(),
            browser: true,
        })
        .await
        .unwrap();
    let b = h.aio.acquire(&acquire("b")).await.unwrap();
    assert_ne!(a.instance_id, b.instance_id);
    assert!(
        a.cdp_url
            .as_deref()
            .is_some_and(|u| u.contains("/devtools/browser/")),
        "{a:?}"
    );

    h.aio
        .exec_instance(&exec(
            "a",
            "echo secret-a > secret.txt; (exec -a marker-a-proc sleep 300 &) ; sleep 0.2",
        ))
        .await
        .unwrap();
    let look = "ls -a /home/gem /tmp; ps -eo args; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '";
    let seen = h.aio.exec_instance(&exec("b", look)).await.unwrap();
    assert!(!seen.stdout.contains("secret"), "{}", seen.stdout);
    assert!(!seen.stdout.contains("marker-a-proc"), "{}", seen.stdout);
    // a's browser profile (its user-data dir, its Chromium) is not in b's instance.
    assert!(!seen.stdout.contains("chromium"), "{}", seen.stdout);
    // b has no network: not a's agent (its only way in is a socket on the host), not the
    // outside. The same probe reaches b's own agent on its loopback, so it would see one.
    let reach = |host: &str, port: u16| {
        format!(
            "python3 -c 'import socket; socket.create_connection((\"{host}\", {port}), timeout=2); print(\"REACHED\")' 2>&1 | tail -1"
        )
    };
    let own = h
        .aio
        .exec_instance(&exec("b", &reach("127.0.0.1", 8080)))
        .await
        .unwrap();
    assert_eq!(own.stdout, "REACHED\n", "{own:?}");
    let r = h
        .aio
        .exec_instance(&exec("b", &reach("1.1.1.1", 80)))
        .await
        .unwrap();
    assert!(!r.stdout.contains("REACHED"), "{r:?}");
    assert!(a.base_url.starts_with("http+unix://"), "{a:?}");
    let a_socket = a
        .base_url
        .trim_start_matches("http+unix://")
        .replace("%2F", "/");
    let a_socket = a_socket.trim_end_matches('/');
    let r = h
        .aio
        .exec_instance(&exec(
            "b",
            &format!("ls /run/sandmesh-aio; test -e {a_socket} || echo absent"),
        ))
        .await
        .unwrap();
    assert_eq!(r.stdout, "agent.sock\nabsent\n", "{r:?}");

    // b may not release (or run in) a's instance by naming it.
    let e = h
        .aio
        .release(&AioRelease {
            session_id: "b".into(),
            instance_id: Some(a.instance_id.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("not bound to session b"), "{e}");
    let mut cross = exec("b", "true");
    cross.instance_id = Some(a.instance_id.clone());
    assert_eq!(
        h.aio.exec_instance(&cross).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let r = h
        .aio
        .exec_instance(&exec("a", "cat secret.txt"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "secret-a\n");
    h.stop().await;
}

#[tokio::test]
async fn python_in_the_instance_drives_its_browser_over_cdp() {
    let h = Harness::start(&[]).await;
    h.aio.acquire(&acquire("web")).await.unwrap();
    let probe = include_str!("cdp_probe.py");
    let r = h
        .aio
        .exec_instance(&exec("web", &python(probe)))
        .await
        .unwrap();
    assert_eq!(r.status, "ok", "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["value"], 42);
    assert!(v["product"].as_str().unwrap().starts_with("Chrome/"), "{v}");
    h.stop().await;
}

#[tokio::test]
async fn twenty_sessions_on_eight_instances_never_exceed_the_cap() {
    let h = Harness::start(&[
        ("SANDMESH_AIO_MAX_INSTANCES", "8"),
        ("SANDMESH_AIO_ACQUIRE_WAIT_MS", "6000"),
    ])
    .await;
    let peak = Arc::new(AtomicUsize::new(0));
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (docker, owner, peak, watching) = (
            h.docker.clone(),
            h.owner.clone(),
            peak.clone(),
            watching.clone(),
        );
        tokio::spawn(async move {
            while watching.load(Ordering::Relaxed) {
                let n = owned_containers(&docker, &owner).await.len();
                peak.fetch_max(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let mut tasks = Vec::new();
    for i in 0..20 {
        let aio = h.aio.clone();
        tasks.push(tokio::spawn(async move {
            let session = format!("c{i}");
            let result = aio.acquire(&acquire(&session)).await;
            if let Ok(lease) = &result {
                // Hold it briefly, then give it back: later waiters are served from the
                // capacity this frees.
                aio.exec_instance(&exec(&session, "sleep 0.5"))
                    .await
                    .unwrap();
                if i % 2 == 0 {
                    aio.release(&release(&session)).await.unwrap();
                }
                return (session, Ok(lease.instance_id.clone()));
            }
            (session, result.map(|l| l.instance_id).map_err(|e| e.kind()))
        }));
    }
    let mut served: HashMap<String, String> = HashMap::new();
    let mut overloaded = 0;
    for t in tasks {
        match t.await.unwrap() {
            (s, Ok(id)) => {
                served.insert(s, id);
            }
            (_, Err(ErrorKind::Overloaded)) => overloaded += 1,
            (s, Err(other)) => panic!("{s}: unexpected {other:?}"),
        }
    }
    watching.store(false, Ordering::Relaxed);
    watcher.await.unwrap();
    let ids: HashSet<&String> = served.values().collect();
    assert_eq!(
        ids.len(),
        served.len(),
        "an instance was given to two sessions: {served:?}"
    );
    assert_eq!(served.len() + overloaded, 20);
    assert!(
        served.len() > 8,
        "released capacity served waiters: {served:?}"
    );
    assert!(
        peak.load(Ordering::Relaxed) <= 8,
        "peak {} containers",
        peak.load(Ordering::Relaxed)
    );
    let stats = h.aio.stats().await.unwrap();
    assert!(stats.total <= 8 && stats.max == 8, "{stats:?}");
    h.stop().await;
}

#[tokio::test]
async fn idle_instances_are_reclaimed_and_used_up_ones_retired() {
    let h = Harness::start(&[
        ("SANDMESH_AIO_IDLE_TIMEOUT_MS", "1500"),
        ("SANDMESH_AIO_MAX_USE_COUNT", "2"),
    ])
    .await;
    let first = h.aio.acquire(&acquire("u")).await.unwrap();
    assert!(
        !h.aio
            .exec_instance(&exec("u", "true"))
            .await
            .unwrap()
            .retired
    );
    let second = h.aio.exec_instance(&exec("u", "true")).await.unwrap();
    assert!(second.retired, "the second use reaches max_use_count 2");
    let (h_ref, gone) = (&h, first.instance_id.clone());
    eventually_true(
        "the used-up instance is removed",
        Duration::from_secs(20),
        || {
            let gone = gone.clone();
            async move { !h_ref.containers().await.contains(&gone) }
        },
    )
    .await;
    assert_eq!(
        h.aio
            .exec_instance(&exec("u", "true"))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    let next = h.aio.acquire(&acquire("u")).await.unwrap();
    assert_ne!(next.instance_id, first.instance_id);

    // Idle for longer than the timeout: reclaimed, and the session's next call says so.
    eventually_true(
        "the idle instance is reclaimed",
        Duration::from_secs(20),
        || async move { h_ref.containers().await.is_empty() },
    )
    .await;
    let e = h.aio.exec_instance(&exec("u", "true")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("idle_timeout"), "{e}");
    h.stop().await;
}

#[tokio::test]
async fn a_killed_instance_is_noticed_and_replaced() {
    let h = Harness::start(&[("SANDMESH_AIO_MIN_INSTANCES", "1")]).await;
    let h_ref = &h;
    let warm = eventually(
        "one warm instance",
        Duration::from_secs(60),
        || async move {
            let s = h_ref.aio.stats().await.ok()?;
            (s.warm == 1).then_some(())?;
            h_ref.containers().await.into_iter().next()
        },
    )
    .await;
    h.docker
        .kill_container(
            &warm,
            None::<bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();
    let replacement = eventually("a replacement is warm", Duration::from_secs(60), || {
        let warm = warm.clone();
        async move {
            let s = h_ref.aio.stats().await.ok()?;
            let names = h_ref.containers().await;
            (s.warm == 1 && names.len() == 1 && names[0] != warm).then(|| names[0].clone())
        }
    })
    .await;
    assert_ne!(replacement, warm);

    // A bound instance that dies: the session is told, and its next acquire gets a new one.
    let lease = h.aio.acquire(&acquire("k")).await.unwrap();
    h.docker
        .kill_container(
            &lease.instance_id,
            None::<bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();
    eventually_true(
        "the dead bound instance is dropped",
        Duration::from_secs(60),
        || async move {
            h_ref
                .aio
                .exec_instance(&exec("k", "true"))
                .await
                .is_err_and(|e| e.kind() == ErrorKind::NotFound)
        },
    )
    .await;
    let again = h.aio.acquire(&acquire("k")).await.unwrap();
    assert_ne!(again.instance_id, lease.instance_id);
    h.stop().await;
}

#[tokio::test]
async fn the_janitor_removes_what_a_killed_pool_left() {
    let nats = test_support::NatsServer::start();
    let dead_owner = unique("dead");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sandmesh-aio-pool"))
        .envs(crate::common::base_env(&nats, &dead_owner))
        .env("SANDMESH_AIO_MIN_INSTANCES", "2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let docker = containers::connect().await.unwrap();
    let (d, o) = (&docker, &dead_owner);
    eventually_true(
        "the doomed pool made 2 instances",
        Duration::from_secs(30),
        || async move { owned_containers(d, o).await.len() == 2 },
    )
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(owned_containers(&docker, &dead_owner).await.len(), 2);

    let h = Harness::start_on(nats, &unique("heir"), &[]).await;
    let dead_dir = h.control_root.with_file_name(&dead_owner);
    assert!(dead_dir.exists(), "{}", dead_dir.display());
    let dead_dir = &dead_dir;
    eventually_true(
        "the janitor removed the dead pool's containers and control directories",
        Duration::from_secs(30),
        || async move { owned_containers(d, o).await.is_empty() && !dead_dir.exists() },
    )
    .await;
    h.stop().await;
}

/// A pool killed while another runs is reaped as soon as its heartbeat expires (the janitor
/// watches the pools' keys), not at a periodic pass: the survivor's pass is an hour away here.
#[tokio::test]
async fn a_pool_killed_beside_a_running_one_is_reaped_when_its_heartbeat_expires() {
    let nats = test_support::NatsServer::start();
    let survivor = unique("survivor");
    let h = Harness::start_on(nats, &survivor, &[("SANDMESH_AIO_JANITOR_MS", "3600000")]).await;
    let doomed = unique("doomed");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sandmesh-aio-pool"))
        .envs(crate::common::base_env(&h.nats, &doomed))
        .env("SANDMESH_AIO_MIN_INSTANCES", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let docker = containers::connect().await.unwrap();
    let (d, o) = (&docker, &doomed);
    eventually_true(
        "the doomed pool made its instance",
        Duration::from_secs(30),
        || async move { owned_containers(d, o).await.len() == 1 },
    )
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    // The control: nothing removes them but the janitor (the doomed pool ran no cleanup).
    assert_eq!(owned_containers(&docker, &doomed).await.len(), 1);
    let dead_dir = h.control_root.with_file_name(&doomed);
    assert!(dead_dir.exists(), "{}", dead_dir.display());
    let dead_dir = &dead_dir;
    eventually_true(
        "the survivor's janitor reaped the killed pool",
        Duration::from_secs(60),
        || async move { owned_containers(d, o).await.is_empty() && !dead_dir.exists() },
    )
    .await;
    h.stop().await;
}

#[tokio::test]
async fn bad_input_gets_clear_errors() {
    let h = Harness::start(&[]).await;
    let e = h.aio.acquire(&acquire("")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadRequest);
    let e = h
        .aio
        .exec_instance(&exec("nobody", "true"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert_eq!(
        h.aio.release(&release("nobody")).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let mut unknown = release("nobody");
    unknown.instance_id = Some("sandmesh-aio-nope".into());
    let e = h.aio.release(&unknown).await.unwrap_err();
    assert!(e.to_string().contains("unknown AIO instance"), "{e}");

    h.aio.acquire(&acquire("big")).await.unwrap();
    let mut slow = exec("big", "true");
    slow.timeout_ms = Some(24 * 3600 * 1000);
    assert_eq!(
        h.aio.exec_instance(&slow).await.unwrap_err().kind(),
        ErrorKind::BadRequest
    );
    assert_eq!(
        h.aio
            .exec_instance(&exec("big", ""))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::BadRequest
    );
    let huge = exec("big", &"x".repeat(aio_pool::pool::MAX_COMMAND_BYTES + 1));
    let e = h.aio.exec_instance(&huge).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooLarge);
    assert!(e.to_string().contains("at most"), "{e}");
    // A command that outlives its timeout is killed and reported as such.
    let mut sleepy = exec("big", "sleep 30");
    sleepy.timeout_ms = Some(500);
    let r = h.aio.exec_instance(&sleepy).await.unwrap();
    assert_eq!(r.status, "timeout", "{r:?}");
    h.stop().await;
}
