//! The isolation checks, against the bwrap backend: file system, secrets,
//! /proc, network, setuid, syscalls (seccomp), and an executor crash (two executions at once
//! are the conformance suite's).
//! Every test checks what the hostile code saw, that the next execution works, and that no
//! process or cgroup of the node is left.

use sandmesh_client::ClientError;
use std::time::Duration;

use crate::common::{processes_in, run, BwrapRuns, Harness};
use messages::exec::{ExecStatus, Language};
use test_support::{eventually, eventually_true, NatsServer};

#[tokio::test]
async fn the_root_is_read_only_and_nothing_persists_between_runs() {
    let h = Harness::start().await;
    let r = h
        .exec(
            Language::Shell,
            "touch /usr/bin/x 2>&1; { echo >> /etc/passwd; } 2>&1; mkdir /opt/y 2>&1; exit 0",
        )
        .await;
    // Files the image's root owns are not even the sandbox user's to try (EACCES before EROFS).
    let refused = r
        .stdout
        .lines()
        .filter(|l| l.contains("Read-only file system") || l.contains("Permission denied"))
        .count();
    assert_eq!(refused, 3, "{r:?}");
    let first = h
        .exec(
            Language::Shell,
            "echo secret > /tmp/marker; echo secret > /workspace/marker; echo secret > /dev/shm/marker; echo done",
        )
        .await;
    assert_eq!(first.stdout, "done\n", "{first:?}");
    let second = h
        .exec(
            Language::Shell,
            "ls /tmp /workspace /dev/shm; cat /tmp/marker /workspace/marker /dev/shm/marker 2>/dev/null; true",
        )
        .await;
    assert!(
        !second.stdout.contains("marker") && !second.stdout.contains("secret"),
        "{second:?}"
    );
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn host_secrets_and_paths_are_out_of_reach() {
    let h = Harness::start().await;
    let code = "cat /etc/shadow >/dev/null 2>&1 && echo SHADOW; \
                tr '\\0' '\\n' < /proc/self/environ; tr '\\0' '\\n' < /proc/1/environ 2>/dev/null; \
                for p in /work /root/.cargo /run/secrets /var/run/docker.sock /run/docker.sock /var/tmp/sandmesh-bwrap /sys/fs/cgroup; do \
                  [ -e $p ] && echo FOUND $p; done; exit 0";
    let r = h.exec(Language::Shell, code).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert!(
        !r.stdout.contains("SHADOW"),
        "/etc/shadow unreadable: {r:?}"
    );
    assert!(!r.stdout.contains("FOUND"), "no host path visible: {r:?}");
    for leak in ["SANDMESH", "NATS", "SECCOMP", "CARGO", "AWS"] {
        assert!(!r.stdout.contains(leak), "{leak} in the environment: {r:?}");
    }
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn proc_shows_only_the_sandbox_and_refuses_tricks() {
    let h = Harness::start().await;
    let code = "echo b > /proc/sysrq-trigger 2>/dev/null && echo SYSRQ; \
                head -c1 /proc/kcore >/dev/null 2>&1 && echo KCORE; \
                echo 1 > /proc/sys/kernel/core_pattern 2>/dev/null && echo SYSCTL; \
                ls /proc/1/root/ 2>/dev/null | grep -qx work && echo HOSTROOT; \
                ls -d /proc/[0-9]* | wc -l";
    let r = h.exec(Language::Shell, code).await;
    for trick in ["SYSRQ", "KCORE", "SYSCTL", "HOSTROOT"] {
        assert!(!r.stdout.contains(trick), "{trick}: {r:?}");
    }
    let visible: usize = r
        .stdout
        .trim()
        .lines()
        .last()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // bwrap's init, the supervisor, bash, ls: nothing of the host.
    assert!(visible <= 6, "{visible} processes visible: {r:?}");
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn there_is_no_network_no_dns_no_metadata_and_no_docker() {
    let h = Harness::start().await;
    let code = r#"
import socket
for host, port in [("1.1.1.1", 80), ("169.254.169.254", 80), ("172.17.0.1", 2375),
                   ("172.17.0.1", 2376), ("fd00:ec2::254", 80), ("8.8.8.8", 53)]:
    try:
        socket.create_connection((host, port), timeout=2)
        print("OPEN", host, port)
    except OSError:
        print("blocked", host)
try:
    socket.getaddrinfo("secret.attacker.example", 80)
    print("RESOLVED")
except OSError:
    print("dns failed")
print(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
"#;
    let r = h.exec(Language::Python, code).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert!(!r.stdout.contains("OPEN"), "{r:?}");
    assert!(!r.stdout.contains("RESOLVED"), "{r:?}");
    assert_eq!(r.stdout.matches("blocked").count(), 6, "{r:?}");
    assert!(r.stdout.ends_with("['lo']\n"), "loopback only: {r:?}");
    h.assert_recovered().await;
    h.stop().await;
}

/// Lists the sandbox's descriptors and what each one is.
const LIST_FDS: &str = "import os\n\
    for fd in sorted(os.listdir('/proc/self/fd'), key=int):\n\
    \x20   try:\n\
    \x20       print(fd, os.readlink('/proc/self/fd/' + fd))\n\
    \x20   except OSError:\n\
    \x20       pass  # the listing's own descriptor, closed by now";

#[tokio::test]
async fn a_sandbox_starts_with_only_its_own_descriptors() {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let h = Harness::start().await;
    // A descriptor of this process (the executor runs in it) without close-on-exec, as
    // whatever starts an executor may leave open.
    let marker = tempfile::Builder::new()
        .prefix("sandmesh-inherited-")
        .tempfile()
        .expect("a temporary file");
    fcntl(marker.as_file(), FcntlArg::F_SETFD(FdFlag::empty())).expect("clear close-on-exec");
    let name = marker
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    // Positive control: a child of this process inherits it.
    let out = std::process::Command::new("sh")
        .args(["-c", "ls -l /proc/$$/fd"])
        .output()
        .expect("sh");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&name),
        "{out:?}"
    );

    let r = h.exec(Language::Python, LIST_FDS).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert!(!r.stdout.contains(&name), "{r:?}");
    // Stdio, and the program's own code (a sealed memfd the supervisor hands it): nothing else.
    let fds: Vec<(&str, &str)> = r.stdout.lines().filter_map(|l| l.split_once(' ')).collect();
    let (stdio, rest): (Vec<_>, Vec<_>) =
        fds.iter().partition(|(fd, _)| ["0", "1", "2"].contains(fd));
    assert_eq!(stdio.len(), 3, "{r:?}");
    assert!(
        matches!(rest.as_slice(), [(_, code)] if code.starts_with("/memfd:sandmesh-code")),
        "{r:?}"
    );
    drop(marker);
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn setuid_gives_no_privilege() {
    let h = Harness::start().await;
    let code = "grep -E '^(NoNewPrivs|CapEff|CapPrm):' /proc/self/status; \
                su root -c 'id -u' </dev/null 2>/dev/null; \
                python3 -c 'import os; os.setuid(0)' 2>/dev/null || echo setuid refused; \
                id -u";
    let r = h.exec(Language::Shell, code).await;
    assert!(r.stdout.contains("NoNewPrivs:\t1"), "{r:?}");
    assert!(r.stdout.contains("CapEff:\t0000000000000000"), "{r:?}");
    assert!(r.stdout.contains("CapPrm:\t0000000000000000"), "{r:?}");
    assert!(r.stdout.contains("setuid refused"), "{r:?}");
    assert!(!r.stdout.lines().any(|l| l == "0"), "never uid 0: {r:?}");
    h.assert_recovered().await;
    h.stop().await;
}

/// The sandbox's processes that the host's user namespace owns (bwrap's outer process) run
/// as a uid of the node's pool when the executor is root (its own uid otherwise), in no
/// supplementary group, with no capability in any set: the inheritable one included, which
/// `setuid` keeps.
#[tokio::test]
async fn the_sandbox_holds_no_host_capability_uid_or_group() {
    let h = Harness::start().await;
    let run = h.exec(Language::Shell, "sleep 3; echo done");
    let needle = format!("/{}/", h.node);
    let inspect = eventually(
        "the sandbox's bwrap to run",
        Duration::from_secs(60),
        || {
            let seen = host_side_statuses(&needle);
            async move { (!seen.is_empty()).then_some(seen) }
        },
    );
    let (r, seen) = tokio::join!(run, inspect);
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "done\n"),
        "{r:?}"
    );
    for (pid, status) in seen {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
                .to_string()
        };
        let uid: u32 = field("Uid:")
            .split_whitespace()
            .next()
            .and_then(|u| u.parse().ok())
            .expect("a uid");
        if nix::unistd::geteuid().is_root() {
            assert!(executor_node::UidRange::BWRAP.contains(uid), "{uid}");
        } else {
            assert_eq!(uid, nix::unistd::geteuid().as_raw());
        }
        let ids = format!("\t{uid}\t{uid}\t{uid}\t{uid}");
        assert_eq!(field("Uid:"), ids, "uids of {pid}");
        assert_eq!(field("Gid:"), ids, "gids of {pid}");
        assert_eq!(field("Groups:").trim(), "", "groups of {pid}");
        for set in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"] {
            assert_eq!(field(set), "\t0000000000000000", "{set} of {pid}");
        }
    }
    h.assert_recovered().await;
    h.stop().await;
}

/// `/proc/<pid>/status` of every bwrap process in a sandbox cgroup of `needle` that is in
/// this process's user namespace (the sandbox's own processes are in theirs). Only once it is
/// bwrap: the launcher before it is the same process, still root for a moment.
pub(crate) fn host_side_statuses(needle: &str) -> Vec<(i32, String)> {
    let ours = std::fs::read_link("/proc/self/ns/user").expect("own user namespace");
    let is_bwrap = |cmd: &str| {
        cmd.split(' ')
            .next()
            .is_some_and(|program| program.rsplit('/').next() == Some("bwrap"))
    };
    processes_in(needle)
        .into_iter()
        .filter(|(pid, cmd)| {
            is_bwrap(cmd)
                && std::fs::read_link(format!("/proc/{pid}/ns/user"))
                    .ok()
                    .as_ref()
                    == Some(&ours)
        })
        .filter_map(|(pid, _)| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            Some((pid, status))
        })
        .collect()
}

#[tokio::test]
async fn dangerous_syscalls_are_refused_by_seccomp() {
    let h = Harness::start().await;
    // bubblewrap's try-syscall idea: harmless arguments; a filtered call fails with EPERM
    // (clone3 with ENOSYS) before the kernel looks at them.
    let code = r#"
import ctypes, errno, subprocess
libc = ctypes.CDLL(None, use_errno=True)
calls = {"mount": 165, "umount2": 166, "pivot_root": 155, "ptrace": 101, "kexec_load": 246,
         "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
         "bpf": 321, "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249,
         "unshare": 272, "setns": 308, "userfaultfd": 323, "open_by_handle_at": 304,
         "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179,
         "syslog": 103, "chroot": 161, "io_uring_setup": 425, "fsopen": 430}
for name, nr in calls.items():
    ctypes.set_errno(0)
    r = libc.syscall(nr, 0, 0, 0, 0, 0)
    print(name, errno.errorcode.get(ctypes.get_errno(), "?") if r == -1 else "ALLOWED")
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17
for name, flags in [("clone_newuser", CLONE_NEWUSER | SIGCHLD), ("clone_newnet", CLONE_NEWNET | SIGCHLD)]:
    r = libc.syscall(56, flags, 0, 0, 0, 0)
    print(name, errno.errorcode.get(ctypes.get_errno(), "?") if r == -1 else "ALLOWED")
r = libc.syscall(435, 0, 0)
print("clone3", errno.errorcode.get(ctypes.get_errno(), "?") if r == -1 else "ALLOWED")
print(subprocess.run(["echo", "fork works"], capture_output=True, text=True).stdout.strip())
"#;
    let r = h.exec(Language::Python, code).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    for line in r.stdout.lines() {
        let (name, verdict) = line.rsplit_once(' ').unwrap();
        match name {
            "clone3" => assert_eq!(verdict, "ENOSYS", "{line}"),
            "fork" => assert_eq!(line, "fork works"),
            _ => assert_eq!(verdict, "EPERM", "{line}"),
        }
    }
    assert_eq!(r.stdout.lines().count(), 31, "{r:?}");
    let r = h
        .exec(
            Language::Shell,
            "mount -t tmpfs none /tmp 2>&1; unshare -r true 2>&1; unshare -n true 2>&1; exit 0",
        )
        .await;
    let refused = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("mount:") || l.starts_with("unshare:"))
        .count();
    assert_eq!(refused, 3, "each refused: {r:?}");
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn an_executor_crash_leaves_nothing_behind() {
    let nats = NatsServer::start();
    let crashed = crate::common::unique_node("crash");
    let mut env = crate::common::base_env(&nats, &crashed);
    env.insert("RUST_LOG".into(), "warn".into());
    let mut process = std::process::Command::new(env!("CARGO_BIN_EXE_sandmesh-bwrap-executor"))
        .env_clear()
        .envs(&env)
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the executor binary");
    let client = test_support::connect(&nats.url()).await;
    let caller =
        kit::mesh_client(client.clone(), Default::default()).with_timeout(Duration::from_secs(60));
    let subject = messages::Subjects::default().executor_node_on(
        messages::executor::Backend::Bwrap,
        &crashed,
        messages::subjects::ExecutorOp::Run,
    );
    // Mid-run: a sandbox with a daemonised orphan.
    let victim = run(
        Language::Shell,
        "setsid sleep 300 & sleep 300",
        &messages::new_id(),
    );
    let in_flight = {
        let caller = caller.clone();
        let subject = subject.clone();
        tokio::spawn(async move {
            loop {
                match caller
                    .request::<_, messages::exec::ExecResult>(subject.clone(), &victim)
                    .await
                {
                    Err(ClientError::NoResponders { .. }) => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    other => return other,
                }
            }
        })
    };
    let needle = format!("/{crashed}/");
    eventually_true("the sandbox to run", Duration::from_secs(120), || async {
        processes_in(&needle).len() >= 2
    })
    .await;
    process.kill().expect("kill -9 the executor");
    let _ = process.wait();
    // The sandbox dies with its executor (bwrap --die-with-parent, then its pid namespace).
    eventually_true(
        "the crashed node's sandbox processes to die",
        Duration::from_secs(10),
        || async { processes_in(&needle).is_empty() },
    )
    .await;
    in_flight.abort();
    // Its cgroups are still there until a live node of the mesh sees its heartbeat expire.
    let survivor = Harness::start_on(nats, &[]).await;
    let root = survivor.backend.cgroup_root.clone();
    eventually_true(
        "the janitor to remove the crashed node's cgroups",
        Duration::from_secs(30),
        || {
            let crashed = crashed.clone();
            let root = root.clone();
            async move { !cgroup_dir_exists(&root, &crashed) }
        },
    )
    .await;
    assert!(processes_in(&needle).is_empty());
    survivor.assert_recovered().await;
    survivor.stop().await;
}

/// Whether any hierarchy still has a directory for `node`.
fn cgroup_dir_exists(root: &std::path::Path, node: &str) -> bool {
    let bases = if root.join("cgroup.controllers").is_file() {
        vec![root.join("sandmesh-bwrap")]
    } else {
        ["memory", "pids", "cpu", "cpuacct"]
            .iter()
            .map(|c| root.join(c).join("sandmesh-bwrap"))
            .collect()
    };
    bases.iter().any(|base| {
        std::fs::read_dir(base)
            .into_iter()
            .flatten()
            .flatten()
            .any(|mesh| mesh.path().join(node).exists())
    })
}
