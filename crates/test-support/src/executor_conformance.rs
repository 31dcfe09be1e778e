//! The backend-conformance suite: the same cases, with the same expectations, against every
//! executor backend, so the backends cannot drift apart again. A backend's test crate
//! implements [`ExecutorHarness`] for its harness (a real nats-server and the backend's
//! `run()` in-process) and instantiates the suite with
//! [`executor_conformance!`](crate::executor_conformance):
//!
//! ```text
//! test_support::executor_conformance!(common::Harness);
//! ```
//!
//! Every case runs sessionless ephemeral runs (what every backend takes) on the node's own run
//! subject, and ends with [`ExecutorHarness::assert_clean`]: nothing of the run is left, and
//! the next run works.

use std::future::Future;
use std::time::Duration;

use messages::exec::{ContentEncoding, ExecRequest, ExecResult, ExecStatus, Language, Limits};
use messages::executor::{ExecutorRun, ExecutorRunStatus, ExecutorStatusQuery, RunKind, RunState};
use messages::tenancy::Tenant;
use messages::{ErrorBody, ErrorKind};

/// One node of a backend under test.
pub trait ExecutorHarness: Sized {
    /// Starts a node on a fresh nats-server (defaults: a 5 s default timeout).
    fn start() -> impl Future<Output = Self>;
    /// One run on the node's own run subject; a refusal is the `Err`. A transport failure
    /// panics.
    fn run(&self, run: &ExecutorRun) -> impl Future<Output = Result<ExecResult, ErrorBody>>;
    /// "What happened to this execution?" on the node's own status subject; a refusal is the
    /// `Err`. A transport failure panics.
    fn status(
        &self,
        query: &ExecutorStatusQuery,
    ) -> impl Future<Output = Result<ExecutorRunStatus, ErrorBody>>;
    /// Bounded poll: no process and no sandbox of this node's runs is left (a backend's warm
    /// pool, ready and unused, may remain).
    fn assert_clean(&self) -> impl Future<Output = ()>;
    /// Stops the node as a signal would and checks it left nothing behind.
    fn stop(self) -> impl Future<Output = ()>;
    /// The name the node's root actor is registered under (`executor_node::root_actor_name`).
    fn root_actor_name(&self) -> String;
    /// Whether the node's heartbeat key is there now.
    fn beating(&self) -> impl Future<Output = bool>;
    /// Waits (bounded) for the node's `run()` to return, without asking it to stop; its error
    /// as text.
    fn ended(&mut self) -> impl Future<Output = Result<(), String>>;
}

/// A sessionless ephemeral run of `code`, with a fresh execution id.
pub fn ephemeral(language: Language, code: &str) -> ExecutorRun {
    pooled(ExecRequest {
        language,
        code: code.to_string(),
        ..Default::default()
    })
}

/// A sessionless run of `request` in a pooled container, with a fresh execution id.
pub fn pooled(request: ExecRequest) -> ExecutorRun {
    let execution_id = messages::new_id();
    let request = ExecRequest {
        execution_id: Some(execution_id.clone()),
        ..request
    };
    ExecutorRun::new(execution_id, request, RunKind::Pooled).expect("a run without a session")
}

/// The same with a timeout and limits.
pub fn limited(language: Language, code: &str, timeout_ms: u64, limits: Limits) -> ExecutorRun {
    let mut run = ephemeral(language, code);
    run.edit_request(|r| r.timeout_ms = Some(timeout_ms));
    run.edit_request(|r| r.limits = Some(limits));
    run
}

async fn answered<H: ExecutorHarness>(h: &H, run: &ExecutorRun) -> ExecResult {
    h.run(run)
        .await
        .unwrap_or_else(|e| panic!("run of {:?} refused: {e:?}", run.request().code))
}

/// After any case: nothing left, and the next run works.
async fn assert_recovered<H: ExecutorHarness>(h: &H) {
    h.assert_clean().await;
    let r = answered(h, &ephemeral(Language::Python, "print(6 * 7)")).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "42\n"),
        "the next run works: {r:?}"
    );
    h.assert_clean().await;
}

/// Every language prints; stdin, env and request files reach the program; the result names
/// the execution and the node.
pub async fn print<H: ExecutorHarness>() {
    let h = H::start().await;
    for (language, code, out) in [
        (Language::Python, "print('hello', 6 * 7)", "hello 42\n"),
        (
            Language::Javascript,
            "console.log([1,2,3].map(x => x * 2).join(','))",
            "2,4,6\n",
        ),
        (Language::Shell, "echo out; echo err >&2", "out\n"),
    ] {
        let run = ephemeral(language, code);
        let r = answered(&h, &run).await;
        assert_eq!(
            (r.status, r.stdout.as_str()),
            (ExecStatus::Ok, out),
            "{r:?}"
        );
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        assert_eq!(r.execution_id, run.execution_id);
        assert!(r.node.is_some(), "the result names its node: {r:?}");
        if language == Language::Shell {
            assert_eq!(r.stderr, "err\n", "{r:?}");
        }
    }
    // The program runs in /workspace as an unprivileged user, with stdin, the request's
    // variables (and none of the node's) and its files, importable from there.
    let mut run = ephemeral(
        Language::Python,
        "import os, sys\n\
         print(sys.stdin.read().upper(), end='')\n\
         print(os.environ['GREETING'], os.getcwd(), os.getuid() != 0)\n\
         print(open('data/in.txt').read(), open('bin.dat','rb').read())\n\
         import helper; print(helper.VALUE)\n\
         print(sorted(k for k in os.environ if k.startswith(('SANDMESH', 'NATS'))))",
    );
    run.edit_request(|r| r.stdin = Some("shout\n".into()));
    run.edit_request(|r| {
        r.env.insert("GREETING".into(), "hi".into());
    });
    let file = |path: &str, content: String, encoding| messages::exec::FileSpec {
        path: path.into(),
        content,
        encoding,
    };
    run.edit_request(|r| {
        r.files = vec![
            file("data/in.txt", "from a file".into(), ContentEncoding::Utf8),
            file(
                "bin.dat",
                messages::encode_base64(&[0, 1, 2]),
                ContentEncoding::Base64,
            ),
            file("helper.py", "VALUE = 42\n".into(), ContentEncoding::Utf8),
        ]
    });
    let r = answered(&h, &run).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(
        r.stdout, "SHOUT\nhi /workspace True\nfrom a file b'\\x00\\x01\\x02'\n42\n[]\n",
        "{r:?}"
    );
    assert_recovered(&h).await;
    h.stop().await;
}

/// A non-zero exit is status `error` with its code, in every language.
pub async fn exit_code<H: ExecutorHarness>() {
    let h = H::start().await;
    let r = answered(
        &h,
        &ephemeral(Language::Shell, "echo out; echo err >&2; exit 3"),
    )
    .await;
    assert_eq!(
        (r.status, r.exit_code),
        (ExecStatus::Error, Some(3)),
        "{r:?}"
    );
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out\n", "err\n"));
    let r = answered(&h, &ephemeral(Language::Python, "raise SystemExit('bye')")).await;
    assert_eq!(
        (r.status, r.exit_code),
        (ExecStatus::Error, Some(1)),
        "{r:?}"
    );
    assert!(r.stderr.contains("bye"), "{r:?}");
    let r = answered(&h, &ephemeral(Language::Javascript, "process.exit(7)")).await;
    assert_eq!(
        (r.status, r.exit_code),
        (ExecStatus::Error, Some(7)),
        "{r:?}"
    );
    assert_recovered(&h).await;
    h.stop().await;
}

/// A burner and a sleeper both end at the wall-clock timeout, as status `timeout`.
pub async fn timeout<H: ExecutorHarness>() {
    let h = H::start().await;
    let burn = "print('burning', flush=True)\nwhile True: pass";
    let r = answered(
        &h,
        &limited(Language::Python, burn, 1000, Limits::default()),
    )
    .await;
    assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    assert_eq!(
        r.error.as_ref().map(|e| e.kind),
        Some(ErrorKind::Timeout),
        "{r:?}"
    );
    assert_eq!(r.stdout, "burning\n", "output before the timeout is kept");
    assert!(
        r.usage.is_some_and(|u| u.cpu_ms > 0),
        "its CPU time counted: {r:?}"
    );
    for (language, code) in [
        (Language::Python, "import time\ntime.sleep(1e6)"),
        (Language::Shell, "sleep 1000"),
    ] {
        let r = answered(&h, &limited(language, code, 1000, Limits::default())).await;
        assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    }
    assert_recovered(&h).await;
    h.stop().await;
}

/// Output past the cap is cut, flagged, and the run killed: status `output_limit`.
pub async fn output_cap<H: ExecutorHarness>() {
    let h = H::start().await;
    let cap = Limits {
        max_output_bytes: Some(64 * 1024),
        ..Default::default()
    };
    let r = answered(&h, &limited(Language::Shell, "yes", 10_000, cap)).await;
    assert_eq!(r.status, ExecStatus::OutputLimit, "{r:?}");
    assert!(r.stdout_truncated, "{r:?}");
    assert_eq!(r.stdout.len(), 64 * 1024, "cut exactly at the cap");
    assert!(r.stdout.starts_with("y\ny\n"), "{r:?}");
    let stderr = "import sys\nwhile True: sys.stderr.write('e' * 4096)";
    let r = answered(&h, &limited(Language::Python, stderr, 10_000, cap)).await;
    assert_eq!(r.status, ExecStatus::OutputLimit, "{r:?}");
    assert!(
        r.stderr_truncated && r.stderr.len() <= 64 * 1024,
        "{}",
        r.stderr.len()
    );
    // Asking for more than one NATS message can carry still gets a deliverable result: the
    // output is cut at what fits (the server's 1 MiB max payload less 64 KiB).
    let huge = Limits {
        max_output_bytes: Some(u64::MAX),
        ..Default::default()
    };
    let r = answered(&h, &limited(Language::Shell, "yes", 10_000, huge)).await;
    assert_eq!(r.status, ExecStatus::OutputLimit, "{}", r.stderr);
    assert_eq!(r.stdout.len(), (1 << 20) - (64 << 10));
    assert_recovered(&h).await;
    h.stop().await;
}

/// Allocating past the memory limit is status `oom` (killed by signal 9), in any language.
///
/// The bombs get a long timeout because the OOM kill is not immediate, in any backend: the
/// limit also counts the page cache of the files the sandbox reads (node's ~48 MiB of code),
/// and at the limit the kernel first evicts those pages, which the program faults back in
/// from disk (~15,000 major faults per JavaScript bomb), until eviction stops gaining. That
/// took 0.7-3.5 s in Docker and 3-7.5 s with bwrap on 2 busy cores, so a 10 s timeout turned
/// a loaded machine's OOM into a timeout. The status is what this case pins, not the speed.
pub async fn memory_limit<H: ExecutorHarness>() {
    const BOMB_TIMEOUT_MS: u64 = 60_000;
    let h = H::start().await;
    let mem = Limits {
        memory_mb: Some(96),
        ..Default::default()
    };
    let bomb = "s = 'x' * (512 << 20)\nprint(len(s))";
    let r = answered(&h, &limited(Language::Python, bomb, BOMB_TIMEOUT_MS, mem)).await;
    assert_eq!(
        (r.status, r.exit_code),
        (ExecStatus::Oom, Some(137)),
        "{r:?}"
    );
    assert_eq!(
        r.error.as_ref().map(|e| e.kind),
        Some(ErrorKind::TooLarge),
        "{r:?}"
    );
    let js = "const a = []; while (true) a.push(Buffer.alloc(16 << 20, 1));";
    let r = answered(&h, &limited(Language::Javascript, js, BOMB_TIMEOUT_MS, mem)).await;
    assert_eq!(r.status, ExecStatus::Oom, "{r:?}");
    assert_recovered(&h).await;
    h.stop().await;
}

/// Processes that leave the program's process group (double forks into new sessions that
/// ignore TERM) die with the run, whether the parent exits at once or times out.
pub async fn orphan_kill<H: ExecutorHarness>() {
    let h = H::start().await;
    let escape =
        "setsid bash -c 'trap \"\" TERM HUP; exec sleep 1000' < /dev/null > /dev/null 2>&1 &\n\
                  (setsid sh -c 'sleep 1001 & sleep 1002' &)\n\
                  nohup sleep 1003 > /dev/null 2>&1 &\n\
                  sleep 0.2\n\
                  echo parent done";
    let r = answered(
        &h,
        &limited(Language::Shell, escape, 10_000, Limits::default()),
    )
    .await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "parent done\n"),
        "{r:?}"
    );
    h.assert_clean().await;
    let stays = format!("{escape}\nsleep 1000");
    let r = answered(
        &h,
        &limited(Language::Shell, &stays, 1500, Limits::default()),
    )
    .await;
    assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    assert_recovered(&h).await;
    h.stop().await;
}

/// A sessionless run can write and read its workspace and /tmp, but nothing it wrote lasts:
/// no file is reported as created (there is no workspace to keep it) and the next run sees
/// none of it.
pub async fn files_created<H: ExecutorHarness>() {
    let h = H::start().await;
    let r = answered(
        &h,
        &ephemeral(
            Language::Shell,
            "mkdir -p out && echo x > out/a.txt && echo y > /tmp/b.txt && cat out/a.txt /tmp/b.txt",
        ),
    )
    .await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "x\ny\n"),
        "{r:?}"
    );
    assert!(
        r.files_created.is_empty() && r.files_modified.is_empty(),
        "files of a sessionless run do not last: {r:?}"
    );
    let r = answered(
        &h,
        &ephemeral(
            Language::Shell,
            "ls -A /workspace; ls /tmp/b.txt 2>/dev/null; echo end",
        ),
    )
    .await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "end\n"),
        "{r:?}"
    );
    assert_recovered(&h).await;
    h.stop().await;
}

/// The longest ids the scheduler sends are taken: a tenant's execution id of the full 64
/// characters is `acme-<64>` after tenant scoping, with the tenant named (a tenant's run) or
/// not (an internal caller's). Ids past the limit, or with characters no subject or sandbox
/// name may hold, are refused (400).
pub async fn long_ids<H: ExecutorHarness>() {
    let h = H::start().await;
    let own = "a".repeat(messages::validate::MAX_ID_LEN);
    let scoped = format!("acme-{own}");
    for tenant in [Some("acme"), None] {
        let mut run = ephemeral(Language::Python, "print('long')");
        run.execution_id = scoped.clone();
        run.edit_request(|r| r.execution_id = Some(own.clone()));
        run.tenant = tenant.map(|t| messages::tenancy::Tenant::new(t).expect("a valid tenant"));
        let r = answered(&h, &run).await;
        assert_eq!(
            (r.status, r.stdout.as_str()),
            (ExecStatus::Ok, "long\n"),
            "{r:?}"
        );
    }
    let too_long = "x".repeat(messages::validate::MAX_ID_LEN + 1);
    for bad in [
        too_long,
        "a b".to_string(),
        "a.b>".to_string(),
        String::new(),
    ] {
        let mut run = ephemeral(Language::Python, "print('never')");
        run.execution_id = bad.clone();
        run.edit_request(|r| r.execution_id = None);
        let e = h.run(&run).await.expect_err(&format!("id {bad:?} refused"));
        assert_eq!(e.code, 400, "id {bad:?}: {e:?}");
    }
    assert_recovered(&h).await;
    h.stop().await;
}

/// An execution id runs once per node, however often its request comes (a scheduler whose
/// reply was lost in a NATS failover sends it again): a repeat while it runs attaches to the
/// run, a repeat after it ended gets the kept answer — the same random output each time — and
/// `status` says `unknown`, `running`, `finished` along the way. Ids are scoped by tenant:
/// another tenant's execution of the same client id is unknown, and naming this tenant's id as
/// another tenant is refused.
pub async fn repeated_id<H: ExecutorHarness>() {
    let h = H::start().await;
    let own = messages::new_id();
    let acme = Tenant::new("acme").expect("a valid tenant");
    let mut slow = limited(
        Language::Shell,
        "sleep 2; echo $RANDOM$RANDOM$RANDOM",
        20_000,
        Limits::default(),
    );
    slow.execution_id = format!("acme-{own}");
    slow.edit_request(|r| r.execution_id = Some(own.clone()));
    slow.tenant = Some(acme.clone());
    let query = ExecutorStatusQuery::of(&slow);
    let state = |q: ExecutorStatusQuery| {
        let h = &h;
        async move {
            h.status(&q)
                .await
                .unwrap_or_else(|e| panic!("status of {q:?} refused: {e:?}"))
                .state
        }
    };
    assert_eq!(state(query.clone()).await, RunState::Unknown);

    let first = answered(&h, &slow);
    let repeats = async {
        crate::eventually(
            "the first run to be running",
            Duration::from_secs(60),
            || {
                let q = query.clone();
                let state = &state;
                async move { (state(q).await == RunState::Running).then_some(()) }
            },
        )
        .await;
        // Different code under the same id: still the one run's answer, not a second run.
        let mut other = slow.clone();
        other.edit_request(|r| r.code = "echo second run".into());
        tokio::join!(answered(&h, &slow), answered(&h, &other))
    };
    let (a, (b, c)) = tokio::join!(first, repeats);
    assert_eq!(a.status, ExecStatus::Ok, "{a:?}");
    assert!(a.stdout.trim().parse::<u64>().is_ok(), "{a:?}");
    assert_eq!(
        (&b.stdout, &c.stdout),
        (&a.stdout, &a.stdout),
        "{b:?} {c:?}"
    );

    let done = h.status(&query).await.expect("status");
    assert_eq!(done.state, RunState::Finished, "{done:?}");
    assert_eq!(done.result.map(|r| r.stdout), Some(a.stdout.clone()));
    let again = answered(&h, &slow).await;
    assert_eq!(again.stdout, a.stdout, "the kept answer, not a second run");

    let beta = Tenant::new("beta").expect("a valid tenant");
    let same_client_id = ExecutorStatusQuery {
        execution_id: format!("beta-{own}"),
        tenant: Some(beta.clone()),
    };
    assert_eq!(state(same_client_id).await, RunState::Unknown);
    let foreign = ExecutorStatusQuery {
        execution_id: slow.execution_id.clone(),
        tenant: Some(beta),
    };
    let refused = h
        .status(&foreign)
        .await
        .expect_err("acme's id asked as beta");
    assert_eq!(refused.code, 400, "{refused:?}");
    assert_recovered(&h).await;
    h.stop().await;
}

/// Two runs at once see nothing of each other: files, processes, abstract sockets.
pub async fn concurrent_isolation<H: ExecutorHarness>() {
    let h = H::start().await;
    let a_code = r#"
import os, socket, time
open("/tmp/a-secret", "w").write("a")
open("/workspace/a-file", "w").write("a")
s = socket.socket(socket.AF_UNIX)
s.bind("\0sandmesh-cross")
s.listen()
time.sleep(4)
print("a done", os.path.exists("/tmp/b-secret"), os.path.exists("/workspace/b-file"))
"#;
    let b_code = r#"
import os, socket
open("/tmp/b-secret", "w").write("b")
open("/workspace/b-file", "w").write("b")
cmds = [open(f"/proc/{p}/cmdline").read() for p in os.listdir("/proc") if p.isdigit()]
print("a seen" if any("a-secret" in c or "sandmesh-cross" in c for c in cmds) else "no a")
print(os.path.exists("/tmp/a-secret"), os.path.exists("/workspace/a-file"))
c = socket.socket(socket.AF_UNIX)
try:
    c.connect("\0sandmesh-cross")
    print("CONNECTED")
except OSError:
    print("refused")
"#;
    let a_run = limited(Language::Python, a_code, 20_000, Limits::default());
    let b_run = ephemeral(Language::Python, b_code);
    let a = answered(&h, &a_run);
    let b = async {
        // B starts while A holds its files, socket and processes (A sleeps 4 s; a B that came
        // after A ended would still have to see nothing).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        answered(&h, &b_run).await
    };
    let (a, b) = tokio::join!(a, b);
    assert_eq!(
        (a.status, a.stdout.as_str()),
        (ExecStatus::Ok, "a done False False\n"),
        "{a:?}"
    );
    assert_eq!(
        (b.status, b.stdout.as_str()),
        (ExecStatus::Ok, "no a\nFalse False\nrefused\n"),
        "{b:?}"
    );
    assert_recovered(&h).await;
    h.stop().await;
}

/// A filesystem policy is enforced by the sandbox's mounts, tried from inside: a hidden
/// directory shows nothing and takes nothing, an allowed one takes writes, a read-only one
/// inside it refuses them, and the workspace stays writable. The same probe without the
/// policy shows the directory's files and refuses the writes (so each check can fail).
pub async fn filesystem_policy<H: ExecutorHarness>() {
    let h = H::start().await;
    let probe = "\
echo \"listed: $(ls -A /etc/apt | wc -l)\"
for f in /etc/apt/f /var/tmp/f /var/tmp/locked/f /workspace/f; do
  if (echo x > $f) 2>/dev/null; then echo \"$f: written\"; else echo \"$f: refused\"; fi
done";
    let plain = answered(&h, &ephemeral(Language::Shell, probe)).await;
    assert_eq!(plain.status, ExecStatus::Ok, "{plain:?}");
    let listed = plain.stdout.lines().next().unwrap_or_default();
    assert_ne!(listed, "listed: 0", "the image has files there: {plain:?}");
    assert!(
        plain
            .stdout
            .contains("/etc/apt/f: refused\n/var/tmp/f: refused\n"),
        "the root is read-only without a policy: {plain:?}"
    );

    // As the scheduler sends it: a container of its own, not a warm one.
    let request = ExecRequest {
        execution_id: None,
        ..ephemeral(Language::Shell, probe).request().clone()
    };
    let isolated = RunKind::Isolated {
        session_grade: false,
    };
    let mut run = ExecutorRun::new(messages::new_id(), request, isolated).unwrap();
    run.filesystem = Some(messages::filesystem::FilesystemPolicy {
        deny_read: vec!["/etc/apt".into()],
        allow_write: vec!["/var/tmp".into()],
        deny_write: vec!["/var/tmp/locked".into()],
    });
    let r = answered(&h, &run).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (
            ExecStatus::Ok,
            "listed: 0\n/etc/apt/f: refused\n/var/tmp/f: written\n\
             /var/tmp/locked/f: refused\n/workspace/f: written\n"
        ),
        "{r:?}"
    );
    assert_recovered(&h).await;
    h.stop().await;
}

/// A run naming a template runs in that template's image — `python-data`'s numpy, which the
/// sandbox image lacks, imported with no network — and its result names the template and
/// image; a template whose image cannot be had is refused as unavailable, and the node runs
/// on. (The first run may build the image, or export its tree, which the caller waits for.)
pub async fn template<H: ExecutorHarness>() {
    let h = H::start().await;
    let code = "import numpy; print(numpy.arange(3).sum())";
    let plain = answered(&h, &ephemeral(Language::Python, code)).await;
    assert!(
        plain.stdout.is_empty() && plain.stderr.contains("ModuleNotFoundError"),
        "the sandbox image has no numpy: {plain:?}"
    );
    let data = messages::template::builtins()
        .into_iter()
        .find(|t| t.name == "python-data")
        .expect("the python-data built-in");
    let mut run = ephemeral(Language::Python, code);
    run.edit_request(|r| r.timeout_ms = Some(30_000));
    run.template = Some(messages::template::RunTemplate {
        name: data.name.clone(),
        image: data.image_spec(),
        // No warm containers of it left behind (`assert_clean` counts the node's own pool).
        warm_pool: Some(0),
    });
    let r = answered(&h, &run).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "3\n"),
        "{r:?}"
    );
    let ran = r.template.as_ref().expect("the result names its template");
    assert_eq!(ran.name, "python-data", "{r:?}");
    assert!(
        ran.image.starts_with(&format!(
            "{}:",
            containers::template::repository("python-data")
        )),
        "the template's own image: {r:?}"
    );

    let mut missing = ephemeral(Language::Python, "print(1)");
    missing.template = Some(messages::template::RunTemplate {
        name: "no-base".into(),
        image: messages::template::ImageSpec {
            base: Some("sandmesh/no-such-base:none".into()),
            pip_packages: vec!["six".into()],
            ..Default::default()
        },
        warm_pool: Some(0),
    });
    let e = h.run(&missing).await.expect_err("no image, no run");
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
    assert_recovered(&h).await;
    h.stop().await;
}

/// A node whose root actor dies stops: its `run()` fails and its heartbeat goes, so the
/// scheduler never places work on a node that cannot run it.
pub async fn dead_root_stops_the_node<H: ExecutorHarness>() {
    let mut h = H::start().await;
    assert!(h.beating().await, "a started node beats");
    let name = h.root_actor_name();
    let root = ractor::registry::where_is(name.clone())
        .unwrap_or_else(|| panic!("no root actor registered as {name}"));
    root.kill();
    let ended = h.ended().await;
    assert!(
        ended.is_err(),
        "run() fails when its root actor dies: {ended:?}"
    );
    assert!(!h.beating().await, "a dead node does not beat");
}

/// Instantiates the suite for a harness type: one `#[tokio::test]` per case, named
/// `conformance::<case>`.
#[macro_export]
macro_rules! executor_conformance {
    ($harness:ty) => {
        $crate::executor_conformance!(@cases $harness;
            print, exit_code, timeout, output_cap, memory_limit, orphan_kill, files_created,
            long_ids, repeated_id, concurrent_isolation, filesystem_policy, template,
            dead_root_stops_the_node);
    };
    (@cases $harness:ty; $($case:ident),+) => {
        mod conformance {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    $crate::executor_conformance::$case::<$harness>().await;
                }
            )+
        }
    };
}
