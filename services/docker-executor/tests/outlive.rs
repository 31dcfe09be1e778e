//! What a run starts does not outlive it, and the code that runs is the code that was sent,
//! attacked from inside a session container: the container's init and the resident supervisor
//! cannot be traced; a kernel cell's thread or timer cannot rewrite later runs' code, read
//! their environment, print into other runs or burn CPU while no cell of its session runs;
//! a run's code cannot be rewritten even by the program itself. Each probe carries its
//! positive control: the same attack on a target it may reach succeeds.

use std::collections::BTreeMap;

use crate::common::{run, DockerRuns, Harness};
use messages::exec::{ExecResult, ExecStatus, Language};

const POOL0: &[(&str, &str)] = &[("SANDMESH_EXEC_WARM_POOL", "0")];

async fn cell(h: &Harness, session: &str, language: Language, code: &str) -> ExecResult {
    cell_within(h, session, language, code, 10_000).await
}

async fn cell_within(
    h: &Harness,
    session: &str,
    language: Language,
    code: &str,
    timeout_ms: u64,
) -> ExecResult {
    let mut r = run(Some(session), language, code);
    r.edit_request(|r| r.kernel = true);
    r.edit_request(|r| r.timeout_ms = Some(timeout_ms));
    h.call_node(&r).await.expect("kernel cell")
}

/// A plain run of the session with `env` added to its environment.
async fn plain_with_env(
    h: &Harness,
    session: &str,
    language: Language,
    code: &str,
    env: &[(&str, &str)],
) -> ExecResult {
    let mut r = run(Some(session), language, code);
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    r.edit_request(|r| r.env = env);
    h.call_node(&r).await.expect("session run")
}

/// PTRACE_ATTACH (ctypes) to every supervisor process (the init among them), and to a child
/// of its own.
const PTRACE_PROBE: &str = r#"
import ctypes, errno, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
def attach(pid):
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        return errno.errorcode[ctypes.get_errno()]
    os.waitpid(pid, 0x40000000)  # __WALL: the attach stop
    libc.ptrace(PTRACE_DETACH, pid, None, None)
    return "attached"
child = subprocess.Popen(["sleep", "30"])
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    try:
        argv = open("/proc/%d/cmdline" % pid, "rb").read().split(b"\0")
    except OSError:
        continue
    if argv[0].endswith(b"/sandmesh-supervisor"):
        print(pid, argv[1].decode(), attach(pid))
print("child", attach(child.pid))
child.kill()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_code_cannot_trace_the_init_or_the_supervisors() {
    let h = Harness::start_with(POOL0).await;
    let s = "no-ptrace";
    // A kernel too, so the run sees every kind of process a session container holds.
    let r = cell(&h, s, Language::Python, "k = 1").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let r = h.session(s, Language::Python, PTRACE_PROBE).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    // The container's init is the supervisor, not Docker's init.
    assert_eq!(lines.first(), Some(&"1 keep EPERM"), "{r:?}");
    for name in ["serve", "run"] {
        let line = lines
            .iter()
            .find(|l| l.split(' ').nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no `{name}` process seen: {r:?}"));
        assert!(line.ends_with(" EPERM"), "{line}: {r:?}");
    }
    assert!(
        lines[..lines.len() - 1]
            .iter()
            .all(|l| l.ends_with(" EPERM")),
        "{r:?}"
    );
    // Positive control: the same attach works on a process the probe may trace.
    assert!(lines.contains(&"child attached"), "{r:?}");
    h.stop().await;
}

/// A kernel thread that rewrites the supervisor's old code files as soon as they appear,
/// creating them ahead of any run too, and counts its writes.
const CODE_SWAPPER: &str = r#"
import os, threading, time
def swap():
    n = 0
    while True:
        os.makedirs("/tmp/.sandmesh", exist_ok=True)
        for name, code in (("main.sh", "echo HIJACKED\n"), ("main.py", "print('HIJACKED')\n"),
                           ("main.js", "console.log('HIJACKED')\n")):
            open("/tmp/.sandmesh/" + name, "w").write(code)
        n += 1
        open("/tmp/swaps", "w").write(str(n))
        time.sleep(0.0005)
threading.Thread(target=swap, daemon=True).start()
time.sleep(0.1)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_thread_cannot_replace_later_runs_code() {
    let h = Harness::start_with(POOL0).await;
    let s = "code-swap";
    let r = cell(&h, s, Language::Python, CODE_SWAPPER).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    for i in 0..3 {
        let r = h
            .session(s, Language::Shell, &format!("echo legit-approved-code-{i}"))
            .await;
        assert_eq!(r.stdout, format!("legit-approved-code-{i}\n"), "{r:?}");
        let r = h
            .session(s, Language::Python, &format!("print('legit python {i}')"))
            .await;
        assert_eq!(r.stdout, format!("legit python {i}\n"), "{r:?}");
        let r = h
            .session(
                s,
                Language::Javascript,
                &format!("console.log('legit js {i}')"),
            )
            .await;
        assert_eq!(r.stdout, format!("legit js {i}\n"), "{r:?}");
    }
    // Positive control: the writer could write the files in /tmp of this container, and does
    // while a cell of its session runs.
    let r = cell(
        &h,
        s,
        Language::Python,
        // The writer truncates and rewrites each file: a read may fall between the two.
        "import time\ndef read(path):\n    while not (t := open(path).read()):\n        pass\n    return t\n\
         a = int(read('/tmp/swaps'))\ntime.sleep(0.3)\n\
         print(int(read('/tmp/swaps')) > a, read('/tmp/.sandmesh/main.sh'), end='')",
    )
    .await;
    assert_eq!(r.stdout, "True echo HIJACKED\n", "{r:?}");
    h.stop().await;
}

/// The program tries to rewrite, truncate and grow its own code through the descriptor it was
/// given; a file of its own in /tmp takes the same writes.
const SELF_REWRITE: &str = r#"
import errno, fcntl, os, sys
path = sys.argv[0]
fd = int(path.rsplit("/", 1)[1])
F_GET_SEALS = 1034
def attempt(what, f):
    try:
        f()
        return what + " done"
    except OSError as e:
        return what + " " + errno.errorcode[e.errno]
def rewrite(p):
    with open(p, "r+b") as f:
        f.write(b"print('HIJACKED')\n")
for p in (path, "/tmp/own-file"):
    open("/tmp/own-file", "w").write("print('x')\n")
    print(attempt("write", lambda: rewrite(p)), attempt("truncate", lambda: os.truncate(p, 0)),
          attempt("grow", lambda: os.truncate(p, 1 << 20)))
print(path.startswith("/proc/self/fd/"), fcntl.fcntl(fd, F_GET_SEALS) & 0xf)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_code_descriptor_cannot_be_rewritten() {
    let h = Harness::start_with(POOL0).await;
    let r = h.session("sealed", Language::Python, SELF_REWRITE).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(
        r.stdout,
        // The code's descriptor: every change refused (F_SEAL_WRITE|SHRINK|GROW|SEAL = 0xf).
        "write EPERM truncate EPERM grow EPERM\n\
         write done truncate done grow done\n\
         True 15\n",
        "{r:?}"
    );
    h.stop().await;
}

/// Every `tick N` of `stdout`, in order.
fn ticks(stdout: &str, word: &str) -> Vec<u64> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(word)?.trim().parse().ok())
        .collect()
}

/// A plain run that reads a counter file twice, half a second apart.
const READ_TWICE: &str =
    "a=$(cat /tmp/ticks 2>/dev/null); sleep 0.5; b=$(cat /tmp/ticks 2>/dev/null); echo \"$a $b\"";

/// Checks the ghost-output contract for a ticker that writes its count to /tmp/ticks before
/// it prints `<word> N` (by rename, so a ticker frozen mid-write never leaves the file empty): frozen between cells (a plain run sees the count stand still), and
/// the next cell shows only ticks printed after it began (every tick printed before the
/// freeze has a number below the count the plain run saw), with at least one (the ticker
/// lives on in its own session's cells).
async fn assert_frozen_between_cells(
    h: &Harness,
    s: &str,
    language: Language,
    word: &str,
    next_cell: &str,
) {
    let r = h.session(s, Language::Shell, READ_TWICE).await;
    let (a, b) = r
        .stdout
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("two reads: {r:?}"));
    assert_eq!(a, b, "the ticker ran while no cell did: {r:?}");
    let frozen_at: u64 = b.parse().expect("the ticker ticked during its cell");
    let r = cell(h, s, language, next_cell).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let seen = ticks(&r.stdout, word);
    assert!(
        seen.iter().all(|&n| n >= frozen_at),
        "output from before the cell (frozen at {frozen_at}): {r:?}"
    );
    assert!(
        seen.iter().any(|&n| n > frozen_at),
        "the ticker prints in its own session's cell: {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_thread_prints_only_into_its_sessions_cells() {
    let h = Harness::start_with(POOL0).await;
    let s = "ghost-py";
    let ticker = "import os, threading, time\n\
        def tick():\n\
        \x20   n = 0\n\
        \x20   while True:\n\
        \x20       n += 1\n\
        \x20       open('/tmp/ticks.new', 'w').write(str(n))\n\
        \x20       os.replace('/tmp/ticks.new', '/tmp/ticks')\n\
        \x20       print('tick', n)\n\
        \x20       time.sleep(0.01)\n\
        threading.Thread(target=tick, daemon=True).start()\n\
        time.sleep(0.1)";
    let r = cell(&h, s, Language::Python, ticker).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert!(!ticks(&r.stdout, "tick").is_empty(), "{r:?}");
    assert_frozen_between_cells(&h, s, Language::Python, "tick", "time.sleep(0.3)").await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_timer_prints_only_into_its_sessions_cells() {
    let h = Harness::start_with(POOL0).await;
    let s = "ghost-js";
    let ticker = "let n = 0\n\
        setInterval(() => { n += 1; const fs = require('fs'); fs.writeFileSync('/tmp/ticks.new', String(n)); fs.renameSync('/tmp/ticks.new', '/tmp/ticks'); console.log('js-tick', n) }, 10)\n\
        await new Promise((done) => setTimeout(done, 100))";
    let r = cell(&h, s, Language::Javascript, ticker).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert!(!ticks(&r.stdout, "js-tick").is_empty(), "{r:?}");
    let wait = "await new Promise((done) => setTimeout(done, 300))";
    assert_frozen_between_cells(&h, s, Language::Javascript, "js-tick", wait).await;
    h.stop().await;
}

/// The CPU time (user + system, clock ticks) of every thread of the kernel named in
/// /tmp/kernel-pid, read twice half a second apart.
const KERNEL_CPU_TWICE: &str = r#"
import os, time
pid = int(open("/tmp/kernel-pid").read())
def cpu():
    total = 0
    for task in os.listdir("/proc/%d/task" % pid):
        fields = open("/proc/%d/task/%s/stat" % (pid, task)).read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total
a = cpu()
time.sleep(0.5)
print(a, cpu())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_cells_busy_threads_use_no_cpu_between_cells() {
    let h = Harness::start_with(POOL0).await;
    let s = "burner";
    // Two busy threads, then a cell that blocks past its timeout (it ends interrupted, the
    // threads live on in the kernel).
    let burner = "import os, threading, time\n\
        open('/tmp/kernel-pid', 'w').write(str(os.getpid()))\n\
        def burn():\n\
        \x20   while True:\n\
        \x20       pass\n\
        for _ in range(2):\n\
        \x20   threading.Thread(target=burn, daemon=True).start()\n\
        time.sleep(100)";
    let r = cell_within(&h, s, Language::Python, burner, 1500).await;
    assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    let cpu = |r: &ExecResult| -> (u64, u64) {
        let (a, b) = r
            .stdout
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("two reads: {r:?}"));
        (a.parse().unwrap(), b.parse().unwrap())
    };
    let r = h.session(s, Language::Python, KERNEL_CPU_TWICE).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let (a, b) = cpu(&r);
    assert_eq!(a, b, "the kernel used CPU while no cell ran: {r:?}");
    // Positive control: the same measurement during a cell of the session sees them burn.
    let r = cell(&h, s, Language::Python, KERNEL_CPU_TWICE).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let (a, b) = cpu(&r);
    assert!(b > a, "the threads burn during a cell: {r:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_thread_cannot_read_later_runs_environment() {
    let h = Harness::start_with(POOL0).await;
    let s = "environ";
    // Reads the environment of every new process as soon as it appears.
    let spy = "import os, threading, time\n\
        def spy():\n\
        \x20   while True:\n\
        \x20       for pid in os.listdir('/proc'):\n\
        \x20           try:\n\
        \x20               env = open('/proc/%s/environ' % pid, 'rb').read()\n\
        \x20           except OSError:\n\
        \x20               continue\n\
        \x20           if b'API_TOKEN=' in env:\n\
        \x20               open('/tmp/leak', 'ab').write(env + b'\\n')\n\
        \x20       time.sleep(0.001)\n\
        threading.Thread(target=spy, daemon=True).start()";
    let r = cell(&h, s, Language::Python, spy).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let r = plain_with_env(
        &h,
        s,
        Language::Shell,
        "sleep 0.5; echo used the token",
        &[("API_TOKEN", "s3cr3t-later-run")],
    )
    .await;
    assert_eq!(r.stdout, "used the token\n", "{r:?}");
    let r = h
        .session(s, Language::Shell, "cat /tmp/leak 2>/dev/null; echo end")
        .await;
    assert!(!r.stdout.contains("s3cr3t-later-run"), "{r:?}");
    // Positive control: during its session's cell the spy reads a process's environment.
    let r = cell(
        &h,
        s,
        Language::Python,
        "import subprocess\n\
         subprocess.run(['sleep', '0.5'], env={'API_TOKEN': 'the-cells-own'})\n\
         print(b'the-cells-own' in open('/tmp/leak', 'rb').read())",
    )
    .await;
    assert_eq!(r.stdout, "True\n", "{r:?}");
    h.stop().await;
}

/// A cell replaces the kernel driver's cell runner: the session's later cells are its to
/// shape (one trust domain, as documented), its plain runs are not — they never run inside a
/// kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_driver_shapes_later_cells_but_never_plain_runs() {
    let h = Harness::start_with(POOL0).await;
    let s = "forged-driver";
    let forge = "import sys\n\
        d = sys.modules['__main__']\n\
        def forged(code):\n\
        \x20   d._send({'t': 'stream', 'name': 'stdout', 'text': 'FORGED\\n'})\n\
        d._execute = forged";
    let r = cell(&h, s, Language::Python, forge).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let r = h
        .session(s, Language::Python, "print('plain python')")
        .await;
    assert_eq!(r.stdout, "plain python\n", "{r:?}");
    let r = h.session(s, Language::Shell, "echo plain shell").await;
    assert_eq!(r.stdout, "plain shell\n", "{r:?}");
    // Positive control: the forgery holds for the session's next cell.
    let r = cell(&h, s, Language::Python, "print('cell code')").await;
    assert_eq!(r.stdout, "FORGED\n", "{r:?}");
    h.stop().await;
}
