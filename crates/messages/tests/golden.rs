//! Golden vectors: the exact bytes of the main payloads in JSON and MessagePack, kept in
//! `testdata/` so clients in other languages can test their codecs against the same bytes.
//! Regenerate (after a deliberate protocol change) with `UPDATE_GOLDEN=1 cargo test -p messages`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use messages::audit::*;
use messages::browser::{
    BrowserAction, BrowserBackend, BrowserPayload, BrowserRequest, ContentFormat,
};
use messages::confirm::{
    ConfirmDecide, ConfirmFile, ConfirmKind, ConfirmScope, ConfirmState, Confirmation,
};
use messages::exec::*;
use messages::executor::{
    Backend, ExecutorRun, ExecutorRunStatus, ExecutorStatusQuery, RunKind, RunState,
};
use messages::filesystem::FilesystemPolicy;
use messages::network::NetworkPolicy;
use messages::ports::{ExposedPort, PortExpose, TunnelConnect, TunnelOpened};
use messages::proc::*;
use messages::risk::*;
use messages::session::{CloseReason, SessionOpen, SessionRecord, SessionState};
use messages::template::{Template, TemplateRan, TemplateRecord, TemplateRef};
use messages::tenancy::Tenant;
use messages::testrun::{
    TestCase, TestCaseStatus, TestReport, TestRequest, TestRunStatus, TestTotals,
};
use messages::workspace::WsWrite;
use messages::{Encoding, ErrorBody};
use serde::de::DeserializeOwned;
use serde::Serialize;

fn risk() -> RiskAssessment {
    RiskAssessment {
        level: RiskLevel::High,
        reason: "imports subprocess".into(),
        requires_confirmation: true,
        requires_isolation: true,
        suggested_tier: Tier::Session,
        findings: vec![Finding {
            rule: "py.subprocess".into(),
            severity: RiskLevel::High,
            description: "runs external commands".into(),
            line: Some(1),
            start: Some(0),
            end: Some(17),
            path: None,
        }],
    }
}

fn exec_request() -> ExecRequest {
    ExecRequest {
        execution_id: Some("01JD0000000000000000000000".into()),
        session_id: Some("s1".into()),
        language: Language::Python,
        code: "print('hi')".into(),
        stdin: None,
        timeout_ms: Some(5000),
        tier: TierChoice::Auto,
        limits: Some(Limits {
            memory_mb: Some(256),
            cpus: None,
            pids: Some(64),
            max_output_bytes: None,
        }),
        env: BTreeMap::from([("GREETING".to_string(), "hello".to_string())]),
        files: vec![FileSpec {
            path: "data/in.txt".into(),
            content: "aGk=".into(),
            encoding: ContentEncoding::Base64,
        }],
        stream_output: true,
        requested_by: Some("agent-7".into()),
        network: None,
        template: None,
        kernel: false,
    }
}

fn exec_result() -> ExecResult {
    ExecResult {
        execution_id: "01JD0000000000000000000000".into(),
        session_id: Some("s1".into()),
        status: ExecStatus::Ok,
        exit_code: Some(0),
        stdout: "hi\n".into(),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        tier: Tier::Session,
        node: Some("node-a".into()),
        risk: risk(),
        confirmation: ConfirmationOutcome {
            decision: Decision::Approved,
            by: Some("alice".into()),
            reason: None,
        },
        files_created: vec!["output/result.txt".into()],
        files_modified: vec![],
        files_refused: vec![],
        files_omitted: 0,
        usage: Some(Usage {
            peak_memory_bytes: 9_000_000,
            cpu_ms: 12,
        }),
        timing: Timing {
            queued_ms: 1,
            assess_ms: 1,
            confirm_ms: 2000,
            exec_ms: 60,
            total_ms: 2063,
        },
        session_restored: false,
        network: None,
        template: None,
        outputs: vec![],
        cell_error: None,
        state_lost: false,
        error: None,
    }
}

/// One run of each kind: pooled, isolated (ephemeral and session-grade), a session's.
fn executor_runs() -> Vec<(&'static str, ExecutorRun)> {
    let sessionless = ExecRequest {
        session_id: None,
        ..exec_request()
    };
    let run = |kind, request, network| {
        let mut run =
            ExecutorRun::new("acme-01JD0000000000000000000000".into(), request, kind).unwrap();
        run.network = network;
        run.tenant = Some(Tenant::new("acme").unwrap());
        run
    };
    let egress = NetworkPolicy {
        allow_domains: vec!["pkgs.example.org".into()],
        ..Default::default()
    };
    vec![
        (
            "executor_run_pooled",
            run(RunKind::Pooled, sessionless.clone(), None),
        ),
        (
            "executor_run_isolated",
            run(
                RunKind::Isolated {
                    session_grade: false,
                },
                sessionless.clone(),
                Some(egress),
            ),
        ),
        (
            "executor_run_isolated_session_grade",
            run(
                RunKind::Isolated {
                    session_grade: true,
                },
                sessionless,
                None,
            ),
        ),
        (
            "executor_run_session",
            run(
                RunKind::Session {
                    session_id: "s1".into(),
                },
                exec_request(),
                None,
            ),
        ),
    ]
}

fn audit_details() -> Vec<AuditDetails> {
    let result = exec_result();
    vec![
        AuditDetails::ExecutionReceived(ExecutionReceived::example()),
        AuditDetails::ExecutionAssessed(ExecutionAssessed::example()),
        AuditDetails::ExecutionFinished(ExecutionFinished {
            status: result.status,
            exit_code: result.exit_code,
            tier: result.tier,
            node: result.node,
            timing: result.timing,
        }),
    ]
}

/// Every other shape of audit details a service writes (the vectors were made from the
/// `json!` literals each emit site wrote before these types).
fn audit_shapes() -> Vec<(&'static str, AuditDetails)> {
    let confirmation_id = || "01JD0000000000000000000001".to_string();
    vec![
        (
            "proc_started",
            ProcessStarted {
                proc_id: confirmation_id(),
                program: "python3".into(),
                command_bytes: 22,
                tag: Some("web".into()),
                pty: false,
                node: "node-a".into(),
                pid: 42,
            }
            .into(),
        ),
        (
            "proc_signaled",
            ProcessSignaled {
                proc_id: confirmation_id(),
                signal: ProcSignalKind::Kill,
            }
            .into(),
        ),
        (
            "proc_ended",
            ProcessEnded {
                proc_id: confirmation_id(),
                state: ProcState::Killed,
                exit_code: None,
                signal: Some(9),
            }
            .into(),
        ),
        (
            "confirmation_requested",
            ConfirmationRequested {
                id: confirmation_id(),
                level: RiskLevel::High,
                summary: "python: imports subprocess".into(),
                expires_at: 1_764_000_060_000,
            }
            .into(),
        ),
        (
            "confirmation_decided",
            ConfirmationDecided {
                id: confirmation_id(),
                state: ConfirmState::Approved,
                by: Some("alice".into()),
                reason: None,
                scope: ConfirmScope::Once,
                waited_ms: 2000,
            }
            .into(),
        ),
        (
            "placed",
            ExecutionPlaced {
                tier: Tier::Session,
                node: Some("node-a".into()),
                reason: "least loaded (1/8)".into(),
                strategy: "least_loaded".into(),
                session_restored: false,
            }
            .into(),
        ),
        (
            "placed_queue_group",
            ExecutionPlaced {
                tier: Tier::Ephemeral,
                node: None,
                reason: "executor queue group".into(),
                strategy: "round_robin".into(),
                session_restored: false,
            }
            .into(),
        ),
        (
            "started",
            ExecutionStarted {
                node: Some("node-a".into()),
                tier: Tier::Session,
                backend: Backend::Docker,
            }
            .into(),
        ),
        (
            "started_queue_group",
            ExecutionStarted {
                node: None,
                tier: Tier::Ephemeral,
                backend: Backend::Bwrap,
            }
            .into(),
        ),
        (
            "rejected_validate",
            ExecutionRejected::Validate {
                reason: "code must not be empty".into(),
            }
            .into(),
        ),
        (
            "rejected_risk",
            ExecutionRejected::Risk {
                level: RiskLevel::Critical,
                reason: "deletes the root".into(),
            }
            .into(),
        ),
        (
            "parked",
            ExecutionParked {
                confirmation_id: confirmation_id(),
                expires_at: 1_764_000_060_000,
            }
            .into(),
        ),
        (
            "resumed",
            ExecutionResumed {
                confirmation_id: confirmation_id(),
                decision: Decision::Approved,
            }
            .into(),
        ),
        (
            "session_opened",
            SessionOpened {
                tier: Tier::Session,
            }
            .into(),
        ),
        (
            "session_closed",
            SessionClosed {
                node: Some("node-a".into()),
                executions: 3,
                reason: CloseReason::Ttl,
            }
            .into(),
        ),
        (
            "session_closed_never_placed",
            SessionClosed {
                node: None,
                executions: 0,
                reason: CloseReason::Requested,
            }
            .into(),
        ),
        (
            "session_lost",
            SessionLost {
                node: "node-a".into(),
                cause: None,
            }
            .into(),
        ),
        (
            "session_lost_heartbeat",
            SessionLost {
                node: "node-a".into(),
                cause: Some(LostCause::HeartbeatExpired),
            }
            .into(),
        ),
        (
            "file_written",
            FileWritten {
                path: "code/main.py".into(),
                size: 9,
                sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into(),
                append: false,
            }
            .into(),
        ),
        (
            "file_deleted",
            FileDeleted {
                path: "data".into(),
                files: 2,
                bytes: 1024,
            }
            .into(),
        ),
        (
            "workspace_restored",
            WorkspaceRestored {
                created: 2,
                modified: 1,
                deleted: 0,
                replace: true,
            }
            .into(),
        ),
        (
            "workspace_cleaned",
            WorkspaceCleaned {
                reason: CleanReason::Ttl,
                files: 3,
                bytes: 4096,
            }
            .into(),
        ),
        (
            "egress_allowed",
            EgressEvent {
                host: "pkgs.example.org".into(),
                port: 443,
                address: Some([93, 184, 215, 14].into()),
                allowed: true,
                rule: "pkgs.example.org is in allow_domains".into(),
            }
            .into(),
        ),
        (
            "egress_refused",
            EgressEvent {
                host: "denied.example".into(),
                port: 443,
                address: None,
                allowed: false,
                rule: "denied.example is not in allow_domains".into(),
            }
            .into(),
        ),
        (
            "browser_risk_assessed",
            BrowserAssessed {
                action: BrowserAction::Fill,
                params: serde_json::json!({"selector": "#q", "text": "hi"}),
                level: RiskLevel::Medium,
                reason: "fills a form".into(),
                confirmation: true,
            }
            .into(),
        ),
        (
            "browser_finished",
            BrowserActed {
                action: BrowserAction::Navigate,
                outcome: BrowserOutcome::Done {
                    url: Some("https://example.org/".into()),
                    state_lost: false,
                },
            }
            .into(),
        ),
        (
            "browser_failed",
            BrowserActed {
                action: BrowserAction::Click,
                outcome: BrowserOutcome::Failed {
                    code: 404,
                    error: "no element matches #go".into(),
                },
            }
            .into(),
        ),
    ]
}

/// Each browser action with its own fields, as the wire carries them.
fn browser_requests() -> Vec<(&'static str, BrowserPayload)> {
    let req = |f: fn(&mut BrowserPayload)| {
        let mut r = BrowserPayload {
            session_id: "s1".into(),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    vec![
        (
            "navigate",
            req(|r| {
                r.url = Some("https://example.org/".into());
                r.timeout_ms = Some(20_000);
                r.requested_by = Some("agent-7".into());
                r.backend = Some(BrowserBackend::External);
            }),
        ),
        ("back", req(|_| {})),
        ("click_index", req(|r| r.index = Some(3))),
        (
            "click_selector",
            req(|r| r.selector = Some("button#go".into())),
        ),
        (
            "fill",
            req(|r| {
                r.index = Some(2);
                r.text = Some("alice".into());
            }),
        ),
        (
            "type",
            req(|r| {
                r.selector = Some("#q".into());
                r.text = Some("sandmesh".into());
            }),
        ),
        ("press_key", req(|r| r.key = Some("Enter".into()))),
        (
            "scroll",
            req(|r| {
                r.dx = Some(-10);
                r.dy = Some(400);
            }),
        ),
        (
            "wait_for_text",
            req(|r| {
                r.text = Some("done".into());
                r.selector = Some("#status".into());
                r.ms = Some(5000);
            }),
        ),
        ("wait_for_ms", req(|r| r.ms = Some(250))),
        ("elements", req(|r| r.is_research = true)),
        (
            "screenshot",
            req(|r| {
                r.full_page = true;
                r.inline = true;
                r.needs_file_access = true;
            }),
        ),
        ("content", req(|r| r.format = ContentFormat::Html)),
        (
            "evaluate",
            req(|r| r.script = Some("document.title".into())),
        ),
        ("close", req(|_| {})),
    ]
}

fn check<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(name: &str, value: &T) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata");
    for (encoding, ext) in [(Encoding::Json, "json"), (Encoding::MsgPack, "msgpack")] {
        let path = dir.join(format!("{name}.{ext}"));
        let bytes = encoding.encode(value).unwrap();
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &bytes).unwrap();
        }
        let golden = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run with UPDATE_GOLDEN=1 to create)",
                path.display()
            )
        });
        assert_eq!(bytes, golden, "{name}.{ext}: encoding changed");
        let decoded: T = encoding.decode(&golden).unwrap();
        assert_eq!(&decoded, value, "{name}.{ext}: decoding changed");
    }
}

fn proc_info() -> ProcInfo {
    ProcInfo {
        proc_id: "01JD0000000000000000000001".into(),
        pid: 42,
        argv: vec!["python3".into(), "-m".into(), "http.server".into()],
        tag: Some("web".into()),
        cwd: Some("site".into()),
        pty: None,
        state: ProcState::Exited,
        exit_code: Some(0),
        signal: None,
        started_at: 1_700_000_000_000,
        ended_at: Some(1_700_000_001_000),
        next_seq: 7,
    }
}

/// The background-process payloads (`messages::proc`).
fn proc_payloads() {
    let start = ProcStart {
        session_id: "s1".into(),
        command: ProcCommand::Argv(vec!["python3".into(), "-m".into(), "http.server".into()]),
        cwd: Some("site".into()),
        env: BTreeMap::from([("PORT".into(), "8000".into())]),
        stdin: true,
        pty: None,
        tag: Some("web".into()),
        timeout_ms: 0,
        requested_by: None,
    };
    check("proc_start", &start);
    let terminal = ProcStart {
        command: ProcCommand::Cmd("bash".into()),
        pty: Some(PtySize { cols: 80, rows: 24 }),
        env: BTreeMap::new(),
        cwd: None,
        tag: None,
        ..start.clone()
    };
    check("proc_start_pty", &terminal);
    check(
        "proc_started",
        &ProcStarted {
            proc_id: "01JD0000000000000000000001".into(),
            pid: 42,
            started_at: 1_700_000_000_000,
        },
    );
    check(
        "proc_ref",
        &ProcRef {
            session_id: "s1".into(),
            proc_id: "01JD0000000000000000000001".into(),
        },
    );
    check(
        "proc_list",
        &ProcList {
            procs: vec![proc_info()],
        },
    );
    let chunk = ProcChunk::new(6, ProcStream::Stdout, b"Serving HTTP\n");
    check(
        "proc_output_request",
        &ProcOutputRequest {
            session_id: "s1".into(),
            proc_id: "01JD0000000000000000000001".into(),
            from_seq: 5,
            max_bytes: Some(65536),
        },
    );
    check(
        "proc_output",
        &ProcOutput {
            chunks: vec![
                chunk.clone(),
                ProcChunk::new(7, ProcStream::Stderr, &[0xff]),
            ],
            next_seq: 8,
            dropped_before: 5,
            state: ProcState::Running,
        },
    );
    let input = ProcInput {
        session_id: "s1".into(),
        proc_id: "01JD0000000000000000000001".into(),
        data: "echo hi\n".into(),
        encoding: ContentEncoding::Utf8,
        eof: false,
        seq: Some(0),
    };
    check("proc_input", &input);
    check("proc_input_ack", &ProcInputAck { next_seq: 1 });
    let signal = ProcSignal {
        session_id: "s1".into(),
        proc_id: "01JD0000000000000000000001".into(),
        signal: ProcSignalKind::Term,
    };
    check("proc_signal", &signal);
    let wait = ProcWait {
        session_id: "s1".into(),
        proc_id: "01JD0000000000000000000001".into(),
        timeout_ms: Some(10_000),
    };
    check("proc_wait", &wait);
    let resize = ProcResize {
        session_id: "s1".into(),
        proc_id: "01JD0000000000000000000001".into(),
        cols: 120,
        rows: 40,
    };
    check("proc_resize", &resize);
    check("proc_event_output", &ProcEvent::Output(chunk));
    check("proc_event_ended", &ProcEvent::Ended(proc_info()));
    check(
        "proc_call_start",
        &ProcCall::Start {
            proc_id: "01JD0000000000000000000001".into(),
            tenant: Some(Tenant::new("acme").unwrap()),
            output_subject: "sandbox.v1.output.acme.01JD0000000000000000000001".into(),
            start,
        },
    );
    check("proc_call_signal", &ProcCall::Signal(signal));
    check("proc_reply_info", &ProcReply::Info(proc_info()));
}

#[test]
fn golden_vectors_are_byte_exact() {
    proc_payloads();
    check("exec_request", &exec_request());
    check("exec_result", &exec_result());
    // A request's egress policy and what the result reports about it.
    check(
        "exec_request_network",
        &ExecRequest {
            session_id: None,
            network: Some(messages::network::NetworkPolicy {
                allow_domains: vec!["pkgs.example.org".into(), "*.files.example.org".into()],
                deny_domains: vec!["evil.files.example.org".into()],
                allow_cidrs: vec!["10.1.0.0/16".into()],
                allow_all: false,
                ports: Some(vec![443]),
            }),
            ..exec_request()
        },
    );
    let mut network = messages::network::NetworkReport::default();
    network.record(
        "pkgs.example.org",
        443,
        true,
        "allowed by allow_domains pkgs.example.org",
    );
    network.record("evil.com", 443, false, "evil.com is not in allow_domains");
    check(
        "exec_result_network",
        &ExecResult {
            network: Some(network),
            ..exec_result()
        },
    );
    // Templates, and a run naming one.
    check(
        "exec_request_template",
        &ExecRequest {
            template: Some("python-data".into()),
            ..exec_request()
        },
    );
    check(
        "exec_result_template",
        &ExecResult {
            template: Some(TemplateRan {
                name: "python-data".into(),
                image: "sandmesh/template-python-data:0123456789ab".into(),
            }),
            ..exec_result()
        },
    );
    // A run whose changes were not all saved: a name the workspace refuses, and changes past
    // the most one run carries back (the error names the limit).
    check(
        "exec_result_files_refused",
        &ExecResult {
            files_refused: vec![RefusedFile {
                path: "weird\nname.txt".into(),
                reason: "control character '\\n' in path".into(),
            }],
            files_omitted: 50_001,
            error: Some(
                ErrorBody::too_large(
                    "the run changed more files than one run saves (at most 10000 changes, \
                     with 192 KiB of names): 50001 changes, those farthest from the \
                     workspace's root, were not saved",
                )
                .with_details(serde_json::json!({
                    "files_omitted": 50_001,
                    "max_changed_paths": 10_000,
                    "max_change_list_bytes": 196_608,
                })),
            ),
            ..exec_result()
        },
    );
    check(
        "template_record",
        &TemplateRecord {
            template: Template {
                name: "python-ml".into(),
                description: "numpy and a pinned PyPI package".into(),
                base: None,
                debian_packages: vec!["python3-numpy".into()],
                pip_packages: vec!["tabulate==0.9.0".into()],
                npm_packages: vec!["left-pad@1.3.0".into()],
                env: BTreeMap::from([("MPLBACKEND".to_string(), "Agg".to_string())]),
                limits: Some(Limits {
                    memory_mb: Some(512),
                    cpus: Some(1.0),
                    pids: None,
                    max_output_bytes: None,
                }),
                timeout_ms: Some(60_000),
                network: Some(NetworkPolicy {
                    allow_domains: vec!["api.example.org".into()],
                    ..Default::default()
                }),
                files: vec![FileSpec {
                    path: "code/helpers.py".into(),
                    content: "X = 1\n".into(),
                    encoding: ContentEncoding::Utf8,
                }],
                warm_pool: Some(2),
                filesystem: None,
            },
            builtin: false,
            created_at: 1_764_000_000_000,
            updated_at: 1_764_000_000_000,
        },
    );
    check(
        "template_ref",
        &TemplateRef {
            name: "python-data".into(),
        },
    );
    // A kernel cell and its typed outputs.
    check(
        "exec_request_kernel",
        &ExecRequest {
            kernel: true,
            files: vec![],
            env: BTreeMap::new(),
            ..exec_request()
        },
    );
    check(
        "exec_result_kernel",
        &ExecResult {
            status: ExecStatus::Error,
            exit_code: Some(1),
            outputs: vec![
                RichOutput {
                    kind: OutputKind::Display,
                    mime_type: "image/png".into(),
                    content: Some("iVBORw0KGgo=".into()),
                    encoding: ContentEncoding::Base64,
                    path: None,
                },
                RichOutput {
                    kind: OutputKind::Result,
                    mime_type: "text/html".into(),
                    content: None,
                    encoding: ContentEncoding::Utf8,
                    path: Some("artifacts/output-1f2e3d4c5b6a.html".into()),
                },
            ],
            cell_error: Some(CellError {
                name: "ZeroDivisionError".into(),
                value: "division by zero".into(),
                traceback: vec!["Traceback (most recent call last):\n".into()],
            }),
            state_lost: true,
            ..exec_result()
        },
    );
    // A session opened with env, a default timeout and a lifetime, and its record
    // once closed by its TTL.
    check(
        "session_open",
        &SessionOpen {
            session_id: Some("s1".into()),
            tier: Some(Tier::Session),
            template: Some("python-data".into()),
            env: BTreeMap::from([("MODE".to_string(), "fast".to_string())]),
            timeout_ms: Some(10_000),
            ttl_ms: Some(3_600_000),
            idle_ms: Some(600_000),
            filesystem: Some(FilesystemPolicy {
                deny_read: vec!["/etc/ssl/private".into()],
                allow_write: vec!["/opt/cache".into()],
                deny_write: vec!["/opt/cache/pinned".into()],
            }),
            ..Default::default()
        },
    );
    check(
        "session_record",
        &SessionRecord {
            session_id: "s1".into(),
            state: SessionState::Closed,
            tier: Tier::Session,
            node: Some("n1".into()),
            created_at: 1_764_000_000_000,
            last_used_at: 1_764_000_100_000,
            executions: 3,
            template: Some("python-data".into()),
            env: BTreeMap::from([("MODE".to_string(), "fast".to_string())]),
            timeout_ms: Some(10_000),
            expires_at: Some(1_764_003_600_000),
            idle_ms: Some(600_000),
            closed_at: Some(1_764_003_600_500),
            close_reason: Some(CloseReason::Ttl),
            ..Default::default()
        },
    );
    // A test-driven run and its per-test report.
    check(
        "test_request",
        &TestRequest {
            execution_id: Some("01JD0000000000000000000002".into()),
            session_id: None,
            language: Language::Python,
            code: "def add(a, b):\n    return a + b\n".into(),
            tests: "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"
                .into(),
            code_file: None,
            tests_file: None,
            files: vec![FileSpec {
                path: "data/urls.txt".into(),
                content: "https://example.org/\n".into(),
                encoding: ContentEncoding::Utf8,
            }],
            template: Some("python-data".into()),
            timeout_ms: Some(30_000),
            limits: None,
            env: BTreeMap::new(),
            requested_by: Some("agent-7".into()),
        },
    );
    let tests = vec![
        TestCase {
            name: "test_add".into(),
            classname: Some("test_solution".into()),
            status: TestCaseStatus::Passed,
            duration_ms: 1,
            message: None,
        },
        TestCase {
            name: "test_sub".into(),
            classname: Some("test_solution".into()),
            status: TestCaseStatus::Failed,
            duration_ms: 2,
            message: Some("assert -1 == 1".into()),
        },
    ];
    check(
        "test_report",
        &TestReport {
            execution_id: "01JD0000000000000000000002".into(),
            session_id: None,
            status: TestRunStatus::Failed,
            totals: TestTotals::of(&tests),
            tests,
            error: None,
            exec_status: ExecStatus::Error,
            exit_code: Some(1),
            stdout: ".F\n1 failed, 1 passed in 0.02s\n".into(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            tier: Tier::Session,
            risk: RiskAssessment::default(),
            confirmation: ConfirmationOutcome::default(),
            template: Some(TemplateRan {
                name: "python-data".into(),
                image: "sandmesh/template-python-data:0123456789ab".into(),
            }),
            usage: None,
            timing: Timing::default(),
        },
    );
    check(
        "assess_request",
        &AssessRequest {
            content: "import subprocess".into(),
            content_type: ContentType::Python,
            params: None,
            mode: Some(SecurityMode::Strict),
            files: Vec::new(),
        },
    );
    check("risk_assessment", &risk());
    // Files sent with the code: assessed with it, and shown with their digest to the person
    // who decides. Both fields are left out when empty, so the vectors above keep their bytes.
    check(
        "assess_request_files",
        &AssessRequest {
            content: "import x".into(),
            content_type: ContentType::Python,
            params: None,
            mode: Some(SecurityMode::Strict),
            files: vec![FileSpec {
                path: "code/x.py".into(),
                content: "import pty\npty.os.system('id')\n".into(),
                encoding: ContentEncoding::Utf8,
            }],
        },
    );
    let in_file = Finding {
        rule: "py.os_system".into(),
        severity: RiskLevel::Critical,
        description: "os.system() runs a shell command — calls pty.os.system".into(),
        path: Some("code/x.py".into()),
        line: Some(2),
        start: Some(11),
        end: Some(31),
    };
    check(
        "confirmation_files",
        &Confirmation {
            id: "01JD0000000000000000000002".into(),
            state: ConfirmState::Pending,
            execution_id: Some("01JD0000000000000000000003".into()),
            risk: RiskAssessment {
                level: RiskLevel::Critical,
                reason: "critical: os.system() runs a shell command [py.os_system] \
                         (file code/x.py, line 2)"
                    .into(),
                requires_confirmation: true,
                requires_isolation: true,
                suggested_tier: Tier::Session,
                findings: vec![in_file],
            },
            summary: "python code (8 bytes) with 1 file (code/x.py), risk critical".into(),
            code_excerpt: "import x".into(),
            files: vec![ConfirmFile {
                path: "code/x.py".into(),
                bytes: 32,
                sha256: "0f".repeat(32),
                excerpt: "import pty\npty.os.system('id')\n".into(),
            }],
            created_at: 1_764_000_000_000,
            expires_at: 1_764_000_060_000,
            ..Default::default()
        },
    );
    check(
        "network_policy",
        &NetworkPolicy {
            allow_domains: vec!["pkgs.example.org".into(), "*.files.example.org".into()],
            deny_domains: vec!["upload.pkgs.example.org".into()],
            allow_cidrs: vec!["10.20.0.0/16".into()],
            allow_all: false,
            ports: Some(vec![443]),
        },
    );
    // "What happened to X?", asked of an executor node, and its answer.
    check(
        "executor_status_query",
        &ExecutorStatusQuery {
            execution_id: "acme-01JD0000000000000000000000".into(),
            tenant: Some(Tenant::new("acme").unwrap()),
        },
    );
    check(
        "executor_run_status",
        &ExecutorRunStatus {
            state: RunState::Finished,
            result: Some(Box::new(exec_result())),
            error: None,
        },
    );
    check(
        "executor_run_status_running",
        &ExecutorRunStatus {
            state: RunState::Running,
            result: None,
            error: None,
        },
    );
    // Each shape a run can take (tier, container and session agree).
    for (name, run) in executor_runs() {
        check(name, &run);
    }
    // One browser request per action (the action is the subject's last token).
    // The typed request of each makes the same bytes again.
    for (name, payload) in browser_requests() {
        check(&format!("browser_{name}"), &payload);
        let action = BrowserAction::ALL
            .iter()
            .copied()
            .find(|a| name.starts_with(a.as_str()))
            .unwrap();
        let typed = BrowserRequest::parse(action, payload.clone()).unwrap();
        assert_eq!(typed.command.action(), action);
        assert_eq!(typed.payload(), payload, "{name}");
    }
    // An execution's audit events, details typed per kind.
    for details in audit_details() {
        check(
            &format!("audit_{}", details.kind().as_str()),
            &AuditEvent::example(details),
        );
    }
    // Every other kind's details, one vector per shape a service writes. `check`
    // decodes each to its type again (an untyped read would not compare equal).
    for (name, details) in audit_shapes() {
        check(&format!("audit_{name}"), &AuditEvent::example(details));
    }
    check(
        "error",
        &ErrorBody::too_large("code is 300000 bytes; the limit is 262144"),
    );
    // What a request with a field its type does not have is answered: refused, never
    // ignored, the field and its object named.
    let misspelt = Encoding::Json
        .decode::<SessionOpen>(br#"{"network": {"allow": ["pkgs.example.org"]}}"#)
        .unwrap_err();
    check("error_unknown_field", &ErrorBody::from(misspelt));
    check(
        "confirmation",
        &Confirmation {
            by_account: None,
            tenant: None,
            id: "01JD0000000000000000000001".into(),
            state: ConfirmState::Approved,
            execution_id: Some("01JD0000000000000000000000".into()),
            session_id: Some("s1".into()),
            risk: risk(),
            summary: "python: imports subprocess".into(),
            code_excerpt: "import subprocess".into(),
            files: Vec::new(),
            kind: ConfirmKind::Code,
            requested_by: Some("agent-7".into()),
            created_at: 1_764_000_000_000,
            expires_at: 1_764_000_060_000,
            by: Some("alice".into()),
            reason: Some("looks fine".into()),
            scope: ConfirmScope::Once,
            decided_at: Some(1_764_000_002_000),
        },
    );
    check(
        "confirm_decide",
        &ConfirmDecide {
            by_account: None,
            id: "01JD0000000000000000000001".into(),
            approve: true,
            by: "alice".into(),
            reason: None,
            scope: ConfirmScope::Session,
        },
    );
    check(
        "ws_write",
        &WsWrite {
            session_id: "s1".into(),
            path: "code/main.py".into(),
            content: "print(1)\n".into(),
            encoding: ContentEncoding::Utf8,
            append: false,
            requested_by: None,
            object: None,
            upload: None,
        },
    );
    check(
        "port_expose",
        &PortExpose {
            session_id: "s1".into(),
            port: 8000,
            ttl_ms: Some(3_600_000),
        },
    );
    check(
        "exposed_port",
        &ExposedPort {
            session_id: "s1".into(),
            port: 8000,
            url: "/api/v1/sessions/s1/ports/8000/".into(),
            token: Some(format!("acme.{}", "0f".repeat(32))),
            expires_at: 1_764_003_600_000,
        },
    );
    check(
        "tunnel_connect",
        &TunnelConnect {
            session_id: "s1".into(),
            port: 8000,
            tunnel_id: "01JD0000000000000000000002".into(),
            token: None,
        },
    );
    check(
        "tunnel_opened",
        &TunnelOpened {
            tunnel_id: "01JD0000000000000000000002".into(),
            up: "sandbox.v1.tunnel.acme.01JD0000000000000000000002".into(),
        },
    );
}

#[test]
fn minimal_json_from_any_client_decodes_with_defaults() {
    let req: ExecRequest = Encoding::Json
        .decode(br#"{"language":"shell","code":"echo hi"}"#)
        .unwrap();
    assert_eq!(req.language, Language::Shell);
    assert_eq!(req.tier, TierChoice::Auto);
    assert!(req.execution_id.is_none() && req.env.is_empty() && !req.stream_output);
}

#[test]
fn both_encodings_round_trip_and_msgpack_decodes_what_json_wrote() {
    let value = exec_result();
    for encoding in [Encoding::Json, Encoding::MsgPack] {
        let back: ExecResult = encoding.decode(&encoding.encode(&value).unwrap()).unwrap();
        assert_eq!(back, value);
    }
}

#[test]
fn wrong_types_and_unknown_enums_are_malformed() {
    for bad in [
        &br#"{"language":"cobol","code":"x"}"#[..],
        br#"{"language":"python","code":42}"#,
        br#"{"language":"python"}"#,
        br#"[1,2,3]"#,
        b"\xff\xfe",
    ] {
        let err = Encoding::Json.decode::<ExecRequest>(bad).unwrap_err();
        assert_eq!(ErrorBody::from(err).code, 400);
    }
    let err = Encoding::MsgPack
        .decode::<ExecRequest>(b"\xc1garbage")
        .unwrap_err();
    assert_eq!(ErrorBody::from(err).code, 400);
}
