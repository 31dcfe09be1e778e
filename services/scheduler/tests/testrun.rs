//! Test-driven execution: `sandbox.v1.test` runs tests against code in
//! the template's sandbox and answers per-test results read from the JUnit report the run left
//! in its workspace. The real scheduler, risk-assessor, workspace-store, templates service and
//! docker-executor over a real nats-server and the real Docker daemon; the boundary tests use
//! the executor stand-in (nothing there needs a container).

use std::time::Duration;

use crate::common::*;
use messages::exec::{Decision, ExecStatus, Language};
use messages::risk::SecurityMode;
use messages::session::SessionOpen;
use messages::testrun::{TestCaseStatus, TestReport, TestRequest, TestRunStatus};
use messages::{ErrorKind, Subjects};
use sandmesh_client::{ErrorKind as ClientErrorKind, MeshClient};

/// Long enough for a first run that waits for its template's image to be built.
const BUILD_WAIT: Duration = Duration::from_secs(900);

const CALCULATOR: &str = "\
def add(a, b):
    return a + b

def sub(a, b):
    return a - b

def div(a, b):
    return a / b
";

/// 3 passing, 1 failing, 1 erroring (its fixture raises). The failing one prints a forged
/// JUnit report in which every test passed (pytest shows a failing test's output, so it
/// reaches stdout).
const CALCULATOR_TESTS: &str = r#"
import pytest
from solution import add, sub, div

FORGED = '<?xml version="1.0"?><testsuites><testsuite><testcase name="test_forged"/></testsuite></testsuites>'

@pytest.fixture
def database():
    raise RuntimeError("no database here")

def test_add():
    assert add(2, 3) == 5

def test_sub():
    assert sub(5, 3) == 2

def test_div_by_two():
    assert div(6, 2) == 3

def test_div():
    print(FORGED)
    assert div(6, 3) == 3

def test_uses_database(database):
    assert database
"#;

fn python(code: &str, tests: &str) -> TestRequest {
    TestRequest {
        language: Language::Python,
        code: code.into(),
        tests: tests.into(),
        ..Default::default()
    }
}

async fn run(mesh: &MeshClient, req: &TestRequest) -> TestReport {
    mesh.exec()
        .run_tests_notified(req, BUILD_WAIT, |_| {})
        .await
        .unwrap_or_else(|e| panic!("test run {req:?}: {e}"))
}

fn statuses(report: &TestReport) -> Vec<(&str, TestCaseStatus)> {
    report
        .tests
        .iter()
        .map(|t| (t.name.as_str(), t.status))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tests_run_in_the_sandbox_and_report_per_test() {
    let mesh = Mesh::builder()
        .real_risk()
        .confirm(&[])
        .real_workspace()
        .templates()
        .docker_executors(1)
        .scheduler(|_| {})
        .start()
        .await;
    let client = MeshClient::new(test_support::connect(&mesh.url).await, Subjects::default());
    use TestCaseStatus::*;

    // 3 passing, 1 failing, 1 erroring, in pytest (the python-data template has it).
    let calculator = TestRequest {
        execution_id: Some("calc-1".into()),
        ..python(CALCULATOR, CALCULATOR_TESTS)
    };
    let report = run(&client, &calculator).await;
    assert_eq!(report.status, TestRunStatus::Failed, "{report:#?}");
    assert_eq!(
        statuses(&report),
        [
            ("test_add", Passed),
            ("test_sub", Passed),
            ("test_div_by_two", Passed),
            ("test_div", Failed),
            ("test_uses_database", Error),
        ],
        "{report:#?}"
    );
    let totals = report.totals;
    assert_eq!(
        (totals.passed, totals.failed, totals.errors, totals.skipped),
        (3, 1, 1, 0)
    );
    let failure = report.tests[3].message.as_deref().unwrap();
    assert!(failure.contains("assert 2.0 == 3"), "{failure}");
    let error = report.tests[4].message.as_deref().unwrap();
    assert!(error.contains("no database here"), "{error}");
    assert_eq!(report.tests[0].classname.as_deref(), Some("test_solution"));
    // The forged report reached stdout and changed nothing above.
    assert!(report.stdout.contains("test_forged"), "{}", report.stdout);
    assert_eq!(report.template.as_ref().unwrap().name, "python-data");
    assert_eq!(report.exec_status, ExecStatus::Error);
    // The internal session is not the caller's, and is closed.
    assert!(report.session_id.is_none());
    eprintln!(
        "measured: first test run (pytest, python-data) {:?}",
        report.timing
    );
    // A replay of the id answers the stored result and the same report; nothing runs again.
    let replay = run(&client, &calculator).await;
    assert_eq!(statuses(&replay), statuses(&report));
    assert_eq!(replay.timing, report.timing);

    // A test that never ends: the tests that finished are reported, the run is a timeout.
    let looping = "\
from solution import add

def test_first():
    assert add(1, 1) == 2

def test_forever():
    while True:
        pass
";
    let report = run(
        &client,
        &TestRequest {
            timeout_ms: Some(8_000),
            ..python(CALCULATOR, looping)
        },
    )
    .await;
    assert_eq!(report.status, TestRunStatus::Timeout, "{report:#?}");
    assert_eq!(
        statuses(&report).first(),
        Some(&("test_first", Passed)),
        "{report:#?}"
    );
    assert_eq!(report.error.unwrap().kind, ErrorKind::Timeout);

    // In the caller's session: the files and the report stay in its workspace.
    let open = SessionOpen {
        session_id: Some("tdd".into()),
        ..Default::default()
    };
    client.sessions().open(&open).await.unwrap();
    let passing = "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n";
    let report = run(
        &client,
        &TestRequest {
            session_id: Some("tdd".into()),
            execution_id: Some("tdd-1".into()),
            ..python(CALCULATOR, passing)
        },
    )
    .await;
    assert_eq!(report.status, TestRunStatus::Passed, "{report:#?}");
    assert_eq!(report.session_id.as_deref(), Some("tdd"));
    let kept = client
        .workspace()
        .read("tdd", "output/test-reports/tdd-1.xml")
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&kept).contains("test_add"));

    // JavaScript with node --test.
    let js = TestRequest {
        language: Language::Javascript,
        code: "exports.add = (a, b) => a + b;\n".into(),
        tests: "\
const test = require('node:test');
const assert = require('node:assert');
const { add } = require('./solution.js');

test('adds', () => { assert.strictEqual(add(1, 2), 3); });
test('adds wrong', () => { assert.strictEqual(add(1, 2), 4); });
test('later', { skip: 'not yet' }, () => {});
"
        .into(),
        ..Default::default()
    };
    let report = run(&client, &js).await;
    assert_eq!(report.status, TestRunStatus::Failed, "{report:#?}");
    assert_eq!(
        statuses(&report),
        [("adds", Passed), ("adds wrong", Failed), ("later", Skipped)],
        "{report:#?}"
    );
    assert!(report.tests[1].message.as_deref().unwrap().contains('4'));
    assert_eq!(report.template.as_ref().unwrap().name, "node-default");
    mesh.shutdown().await;
}

/// The real mesh the forgery probes run in. Their code is rated high (it reaches `os`, `fs`,
/// other processes): a person approves each at once, as one who did not see through it would.
async fn attacked_mesh() -> Mesh {
    Mesh::builder()
        .real_risk()
        .confirm_standin(true)
        .real_workspace()
        .templates()
        .docker_executors(1)
        .scheduler(|_| {})
        .start()
        .await
}

/// The tests of the forgery probes: a wrong `twice` fails the first.
const TWICE_TESTS: &str = "\
from solution import twice

def test_doubles():
    assert twice(21) == 42

def test_zero():
    assert twice(0) == 0
";

const HONEST_TWICE: &str = "def twice(x):\n    return 2 * x\n";

/// The probe as it broke the run: a wrong solution whose exit hook rewrites every report as
/// all-passing and forces exit 0.
const ATEXIT_FORGERY: &str = "def twice(x): return 3*x\nimport atexit,glob,os\ndef f():\n  for p in glob.glob('/workspace/output/test-reports/*.xml'): open(p,'w').write('<testsuites><testsuite tests=\"2\" failures=\"0\" errors=\"0\"><testcase classname=\"t\" name=\"test_doubles\"/><testcase classname=\"t\" name=\"test_zero\"/></testsuite></testsuites>')\n  os._exit(0)\natexit.register(f)";

/// Writes records into the runner's pipe as its pytest plugin would (the plugin's module is in
/// the same interpreter, so its descriptor is one attribute away).
const RECORD_WRITER: &str = "\
import json, os, sys

def send(**record):
    os.write(sys.modules['sandmesh_records']._PIPE, (json.dumps(record) + '\\n').encode())

def passed(test):
    send(kind='test', id='test_solution.py::' + test, name=test, classname='test_solution',
         status='passed', duration_ms=1)
";

/// A wrong solution that leaves a process behind, holding the run's stdout so the run lasts,
/// which waits for the runner's sealed report and rewrites it as all-passing, with a seal of
/// its own making.
const LINGERING_FORGERY: &str = r#"def twice(x): return 3*x
import atexit, glob, os, time
FORGED = ('<?xml version="1.0" encoding="utf-8"?>\n<testsuites sandmesh-run="complete">'
          '<testsuite tests="2"><testcase classname="test_solution" name="test_doubles"/>'
          '<testcase classname="test_solution" name="test_zero"/></testsuite></testsuites>\n'
          '<!-- sandmesh-report-hmac-sha256 ' + '0' * 64 + ' -->\n')
def linger():
    if os.fork():
        return
    os.setsid()
    deadline = time.time() + 20
    while time.time() < deadline:
        for path in glob.glob('/workspace/output/test-reports/*.xml'):
            if 'sandmesh-report' in open(path).read() and FORGED != open(path).read():
                open(path, 'w').write(FORGED)
                print('LINGERER: rewrote', path, flush=True)
                os._exit(0)
        time.sleep(0.01)
    os._exit(0)
atexit.register(linger)
"#;

/// A wrong solution that takes the report's place away: at exit, the reports' directory
/// becomes a file, so the runner can write no report.
const REPORT_DELETER: &str = "def twice(x): return 3*x\nimport atexit, os, shutil\ndef f():\n    os.makedirs('/workspace/output', exist_ok=True)\n    shutil.rmtree('/workspace/output/test-reports', ignore_errors=True)\n    open('/workspace/output/test-reports', 'w').write('gone')\n    os._exit(0)\natexit.register(f)\n";

fn twice(code: &str) -> TestRequest {
    python(code, TWICE_TESTS)
}

/// Whatever the probe did, the run is not `passed` and its error says why.
fn refused(report: &TestReport, why: &str) {
    assert_eq!(report.status, TestRunStatus::Error, "{report:#?}");
    assert!(report.tests.is_empty(), "{report:#?}");
    let error = report.error.as_ref().expect("an error");
    assert!(error.message.contains(why), "{why:?} not in {error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_python_solution_cannot_forge_its_verdict() {
    let mesh = attacked_mesh().await;
    let client = MeshClient::new(test_support::connect(&mesh.url).await, Subjects::default());
    use TestCaseStatus::*;

    // The control: the right solution passes, 2 of 2, as the runner's own records say.
    let report = run(&client, &twice(HONEST_TWICE)).await;
    assert_eq!(report.status, TestRunStatus::Passed, "{report:#?}");
    assert_eq!(
        statuses(&report),
        [("test_doubles", Passed), ("test_zero", Passed)]
    );
    assert_eq!((report.totals.passed, report.totals.failed), (2, 0));

    // The probe's own code: the rewritten file is replaced by the runner's, and the exit code
    // it forced disagrees with what pytest said at its end.
    let report = run(&client, &twice(ATEXIT_FORGERY)).await;
    refused(
        &report,
        "the test tool exited with 0, but its closing record says 1",
    );

    // Gone before any test ran: no closing record.
    let early = "def twice(x): return 3*x\nimport os\nos._exit(0)\n";
    let report = run(&client, &twice(early)).await;
    refused(&report, "without its closing record");

    // Records written into the runner's pipe beside pytest's: a test announced twice, an
    // outcome for a test that was never collected, a closing record before the real one.
    let duplicates = format!(
        "{RECORD_WRITER}\nfor test in ('test_doubles', 'test_zero'):\n    \
         send(kind='collected', id='test_solution.py::' + test)\n    passed(test)\n\
         def twice(x): return 3*x\n"
    );
    let report = run(&client, &twice(&duplicates)).await;
    refused(&report, "'test_solution.py::test_doubles' collected twice");
    let uncollected = format!("{RECORD_WRITER}\npassed('test_extra')\ndef twice(x): return 3*x\n");
    let report = run(&client, &twice(&uncollected)).await;
    refused(
        &report,
        "an outcome for test 'test_solution.py::test_extra', which was never collected",
    );
    let closing = format!(
        "{RECORD_WRITER}\nsend(kind='closing', collected=0, exit=0)\ndef twice(x): return 3*x\n"
    );
    let report = run(&client, &twice(&closing)).await;
    refused(&report, "a record after the closing record");

    // The report rewritten after the runner wrote it, by a process the code left behind: the
    // seal does not match. (A sandbox that ends such a process with the run leaves the
    // runner's own report: the real failure.)
    let report = run(&client, &twice(LINGERING_FORGERY)).await;
    assert_ne!(report.status, TestRunStatus::Passed, "{report:#?}");
    if report.stdout.contains("LINGERER: rewrote") {
        refused(&report, "the test report's seal does not match");
    } else {
        assert_eq!(report.status, TestRunStatus::Failed, "{report:#?}");
        assert_eq!(statuses(&report)[0], ("test_doubles", Failed));
    }

    // No report at all: an error that says so.
    let report = run(&client, &twice(REPORT_DELETER)).await;
    assert_eq!(report.status, TestRunStatus::Error, "{report:#?}");
    assert_eq!(report.error.unwrap().kind, ErrorKind::NotFound);
    mesh.shutdown().await;
}

/// The JavaScript tests of the forgery probes.
const ADD_TESTS: &str = "\
const test = require('node:test');
const assert = require('node:assert');
const { add } = require('./solution.js');

test('adds', () => { assert.strictEqual(add(1, 2), 3); });
test('adds zero', () => { assert.strictEqual(add(0, 0), 0); });
";

fn javascript(code: &str) -> TestRequest {
    TestRequest {
        language: Language::Javascript,
        code: code.into(),
        tests: ADD_TESTS.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_javascript_solution_cannot_forge_its_verdict() {
    let mesh = attacked_mesh().await;
    let client = MeshClient::new(test_support::connect(&mesh.url).await, Subjects::default());
    use TestCaseStatus::*;

    // The control.
    let report = run(&client, &javascript("exports.add = (a, b) => a + b;\n")).await;
    assert_eq!(report.status, TestRunStatus::Passed, "{report:#?}");
    assert_eq!(statuses(&report), [("adds", Passed), ("adds zero", Passed)]);

    // The exit hook rewrites every report as all-passing and forces exit 0; the report that
    // counts is written after the tests' process ended, from the reporter's records.
    let on_exit = r#"exports.add = (a, b) => a - b;
const fs = require('node:fs');
process.on('exit', () => {
  const dir = '/workspace/output/test-reports';
  for (const name of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
    fs.writeFileSync(`${dir}/${name}`, '<testsuites sandmesh-run="complete"><testsuite><testcase name="adds"/><testcase name="adds zero"/></testsuite></testsuites>\n');
  }
  process.exitCode = 0;
});
"#;
    let report = run(&client, &javascript(on_exit)).await;
    assert_eq!(report.status, TestRunStatus::Failed, "{report:#?}");
    assert_eq!(statuses(&report), [("adds", Failed), ("adds zero", Passed)]);

    // Records written into the reporter's pipe from the tests' own process, through the
    // reporter's process: the passing outcome it forged collides with the real one.
    let records = r#"exports.add = (a, b) => a - b;
const fs = require('node:fs');
const pipe = fs.openSync(`/proc/${process.ppid}/fd/${process.env.SANDMESH_TEST_RECORDS}`, 'w');
for (const line of [
  { kind: 'collected', id: 'solution.test > adds' },
  { kind: 'test', id: 'solution.test > adds', name: 'adds', classname: 'solution.test', status: 'passed' },
]) fs.writeSync(pipe, JSON.stringify(line) + '\n');
"#;
    let report = run(&client, &javascript(records)).await;
    refused(&report, "'solution.test > adds' collected twice");

    // The report's place taken away: no report, an error.
    let deleter = r#"exports.add = (a, b) => a - b;
const fs = require('node:fs');
process.on('exit', () => {
  fs.mkdirSync('/workspace/output', { recursive: true });
  fs.rmSync('/workspace/output/test-reports', { recursive: true, force: true });
  fs.writeFileSync('/workspace/output/test-reports', 'gone');
});
"#;
    let report = run(&client, &javascript(deleter)).await;
    assert_eq!(report.status, TestRunStatus::Error, "{report:#?}");
    assert_eq!(report.error.unwrap().kind, ErrorKind::NotFound);
    mesh.shutdown().await;
}

/// From inside the tests: the runner's parent, which holds the key, cannot be read (its
/// environment, stdin, memory), and no 64-hex-digit string other than the one planted in the
/// tests' own environment shows in any process's environment or command line, or in a file of
/// /tmp or the workspace.
const KEY_SEARCH: &str = r#"
import os, re

HEX64 = re.compile(rb"[0-9a-f]{64}")

def read(path, whole=True):
    # A process's memory is not read from its start (unmapped): opening it is the test.
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20) if whole else b""
    except Exception as e:
        return type(e).__name__

def test_probe():
    import subprocess
    sibling = subprocess.Popen(["sleep", "30"])
    found = {}
    for who, pid in (("parent", os.getppid()), ("sibling", sibling.pid)):
        for what in ("environ", "fd/0", "mem"):
            got = read(f"/proc/{pid}/{what}", what != "mem")
            found[f"{who} {what}"] = "read" if isinstance(got, bytes) else got
    hits = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for what in ("environ", "cmdline"):
            got = read(f"/proc/{pid}/{what}")
            if isinstance(got, bytes):
                hits.update(HEX64.findall(got))
    for top in ("/tmp", "/workspace"):
        for root, _, files in os.walk(top):
            for name in files:
                got = read(os.path.join(root, name))
                if isinstance(got, bytes):
                    hits.update(HEX64.findall(got))
    sibling.kill()
    found["hex64"] = sorted(h.decode() for h in hits)
    assert False, "PROBE " + repr(sorted(found.items()))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_report_key_is_out_of_the_tests_reach() {
    let mesh = attacked_mesh().await;
    let client = MeshClient::new(test_support::connect(&mesh.url).await, Subjects::default());
    let planted = "ab".repeat(32);
    let req = TestRequest {
        env: [("PLANTED".to_string(), planted.clone())].into(),
        ..python("x = 1\n", KEY_SEARCH)
    };
    let report = run(&client, &req).await;
    assert_eq!(report.status, TestRunStatus::Failed, "{report:#?}");
    let probe = report.tests[0].message.as_deref().unwrap();
    // The control: a process of the same user that is dumpable can be read, and the search
    // finds what is planted in the tests' own environment.
    for read in ["sibling environ", "sibling fd/0", "sibling mem"] {
        assert!(probe.contains(&format!("('{read}', 'read')")), "{probe}");
    }
    // The parent cannot be, and nothing else looks like a key.
    for refused in ["parent environ", "parent fd/0", "parent mem"] {
        assert!(
            probe.contains(&format!("('{refused}', 'PermissionError')")),
            "{probe}"
        );
    }
    assert!(
        probe.contains(&format!("('hex64', ['{planted}'])")),
        "{probe}"
    );
    mesh.shutdown().await;
}

/// Code the risk stand-in rates high: a person must approve it.
const RISKY_TESTS: &str = "import os\n\ndef test_shell():\n    os.system('true')\n";

/// The services around the scheduler, with the executor stand-in: these tests need no container.
fn without_containers() -> MeshBuilder {
    Mesh::builder()
        .risk()
        .confirm(&[])
        .real_workspace()
        .templates()
        .executor("node-a", 4)
}

#[tokio::test]
async fn a_risky_test_run_waits_for_a_person_like_an_exec() {
    let mesh = without_containers()
        .scheduler(|c| c.security_mode = SecurityMode::Strict)
        .start()
        .await;
    let agent = MeshClient::new(test_support::connect(&mesh.url).await, Subjects::default());
    let req = TestRequest {
        execution_id: Some("risky-tests".into()),
        ..python("def f():\n    return 1\n", RISKY_TESTS)
    };
    // Told at once that a person must decide, while the call goes on waiting for the report.
    let (noticed, notice) = tokio::sync::oneshot::channel();
    let mut noticed = Some(noticed);
    let running = tokio::spawn(async move {
        agent
            .exec()
            .run_tests_notified(&req, WAIT, move |awaiting| {
                if let Some(tx) = noticed.take() {
                    let _ = tx.send(awaiting);
                }
            })
            .await
    });
    let awaiting = tokio::time::timeout(WAIT, notice)
        .await
        .expect("a notice in time")
        .unwrap();
    assert_eq!(awaiting.execution_id, "risky-tests");

    // The person sees the code and the tests, not the runner that drives them.
    let operator = MeshClient::new(test_support::connect(&mesh.url).await, Subjects::default());
    let pending = operator
        .confirm()
        .get(&awaiting.confirmation_id)
        .await
        .unwrap();
    assert!(pending.code_excerpt.contains("os.system('true')"));
    assert!(
        !pending.code_excerpt.contains("pytest"),
        "{}",
        pending.code_excerpt
    );

    operator
        .confirm()
        .decide(&messages::confirm::ConfirmDecide {
            id: awaiting.confirmation_id.clone(),
            approve: true,
            by: "tester".into(),
            reason: None,
            scope: Default::default(),
            by_account: None,
        })
        .await
        .unwrap();
    let report = running.await.unwrap().expect("the report");
    assert_eq!(report.confirmation.decision, Decision::Approved);
    // The stand-in executor runs nothing and leaves no report: a terminal error that says so.
    assert_eq!(report.status, TestRunStatus::Error, "{report:#?}");
    assert_eq!(report.error.unwrap().kind, ErrorKind::NotFound);
    mesh.shutdown().await;
}

#[tokio::test]
async fn tenants_cannot_name_each_others_sessions_and_bad_requests_are_refused() {
    let mesh = without_containers()
        .tenants(&["acme", "beta"], &[])
        .scheduler(|_| {})
        .start()
        .await;
    let agent = |tenant: &str| {
        let url = mesh.nats.agent_url(tenant);
        async move {
            let (options, plain) = test_support::connect_options(&url);
            let nats = options.connect(plain).await.expect("connect");
            MeshClient::new(nats, Subjects::default()).with_timeout(Duration::from_secs(20))
        }
    };
    let acme = agent("acme").await;
    let beta = agent("beta").await;
    let open = SessionOpen {
        session_id: Some("shared-name".into()),
        ..Default::default()
    };
    acme.sessions().open(&open).await.unwrap();
    let req = TestRequest {
        session_id: Some("shared-name".into()),
        ..python("x = 1\n", "def test_x():\n    pass\n")
    };
    let e = beta.exec().run_tests(&req).await.unwrap_err();
    assert_eq!(e.kind(), ClientErrorKind::NotFound, "{e}");
    // The owner reaches it (the stand-in runs nothing, so the report is an error report).
    let report = acme.exec().run_tests(&req).await.unwrap();
    assert_eq!(report.session_id.as_deref(), Some("shared-name"));

    // Malformed, oversized and hostile requests, sent raw as any client could.
    let huge = "x".repeat(300 * 1024);
    let bad: Vec<(serde_json::Value, ClientErrorKind, &str)> = vec![
        (
            serde_json::json!({"language": "python", "code": "x"}),
            ClientErrorKind::BadRequest,
            "tests",
        ),
        (
            serde_json::json!({"language": "shell", "code": "x", "tests": "y"}),
            ClientErrorKind::BadRequest,
            "language",
        ),
        (
            serde_json::json!({"language": "python", "code": huge, "tests": "def test(): pass"}),
            ClientErrorKind::TooLarge,
            "code",
        ),
        (
            serde_json::json!({"language": "python", "code": "x", "tests": "y",
                               "tests_file": "../../etc/passwd"}),
            ClientErrorKind::BadRequest,
            "tests_file",
        ),
        (
            serde_json::json!({"language": "python", "code": "x", "tests": "y",
                               "execution_id": "a.b>c"}),
            ClientErrorKind::BadRequest,
            "execution_id",
        ),
        (
            serde_json::json!({"language": "python", "code": "x", "tests": "y",
                               "files": [{"path": "/etc/shadow", "content": "x"}]}),
            ClientErrorKind::BadRequest,
            "files[0].path",
        ),
        (
            serde_json::json!({"language": "python", "code": "x", "tests": "y",
                               "env": {"LD_PRELOAD": "/tmp/x.so"}}),
            ClientErrorKind::BadRequest,
            "env.LD_PRELOAD",
        ),
    ];
    for (body, kind, field) in bad {
        let e = beta
            .request::<_, TestReport>(Subjects::default().test(), &body)
            .await
            .expect_err(field);
        assert_eq!(e.kind(), kind, "{field}: {e}");
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
    let e = beta
        .nats()
        .request(Subjects::default().test(), "{not json".into())
        .await
        .unwrap();
    let code = e
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Service-Error-Code"));
    assert_eq!(code.map(|c| c.as_str()), Some("400"));
    mesh.shutdown().await;
}
