//! Every request type refuses a field it does not have, at its top and in every object nested
//! in it, naming the field and where it is, in both encodings; the same payload without the
//! field decodes. A field a server ignores is a downgrade nobody is told of: `network: {allow:
//! [...]}` for `allow_domains` would open a session with no network policy at all.

use messages::browser::{AioAcquire, AioExec, AioRelease, AioStatsRequest, BrowserPayload};
use messages::codec::{CodecError, UnknownField};
use messages::confirm::{ConfirmDecide, ConfirmGet, ConfirmList, ConfirmRequest};
use messages::exec::{ExecRequest, ResultGet};
use messages::executor::{ExecutorClose, ExecutorDrain, ExecutorRun, ExecutorStatusQuery};
use messages::ports::{ExecutorTunnel, PortExpose, PortRef, TunnelConnect};
use messages::proc::{
    ProcCall, ProcInput, ProcOutputRequest, ProcRef, ProcResize, ProcSignal, ProcStart, ProcWait,
};
use messages::risk::AssessRequest;
use messages::session::{SessionList, SessionOpen, SessionRef, SessionTtl};
use messages::template::{RunTemplate, Template, TemplateList, TemplateRef};
use messages::testrun::TestRequest;
use messages::workspace::{
    UploadRef, WsCleanup, WsFetch, WsInit, WsList, WsPath, WsRead, WsRestore, WsSnapshot,
    WsUploadChunk, WsUsageRequest, WsWrite,
};
use messages::{Encoding, ErrorBody, ErrorKind};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

const ODD: &str = "not_a_field";

/// `payload` as each encoding carries it.
fn encoded(payload: &Value) -> [(Encoding, Vec<u8>); 2] {
    [
        (Encoding::Json, serde_json::to_vec(payload).unwrap()),
        (Encoding::MsgPack, rmp_serde::to_vec_named(payload).unwrap()),
    ]
}

fn refused<T: DeserializeOwned + std::fmt::Debug>(
    encoding: Encoding,
    bytes: &[u8],
) -> UnknownField {
    match encoding.decode::<T>(bytes) {
        Err(CodecError::UnknownField(unknown)) => *unknown,
        other => panic!("{encoding:?}: expected an unknown field, got {other:?}"),
    }
}

/// `T` takes `valid`, and refuses it with [`ODD`] added at its top and in each object of
/// `nested` (JSON pointers into `valid`), naming the field and the object in both encodings.
fn strict<T: DeserializeOwned + std::fmt::Debug>(of: &str, valid: Value, nested: &[&str]) {
    for (encoding, bytes) in encoded(&valid) {
        if let Err(e) = encoding.decode::<T>(&bytes) {
            panic!("{of} refused a known payload in {encoding:?}: {e}\n{valid}");
        }
    }
    let mut top = valid.clone();
    top[ODD] = json!(1);
    for (encoding, bytes) in encoded(&top) {
        let unknown = refused::<T>(encoding, &bytes);
        assert_eq!(
            (unknown.field.as_str(), unknown.object.as_str(), unknown.of),
            (ODD, "", of),
            "{encoding:?}"
        );
        assert_eq!(unknown.path, ODD);
        let message = unknown.to_string();
        assert!(
            message.starts_with(&format!("unknown field `{ODD}` in `{of}` (")),
            "{message}"
        );
    }
    for pointer in nested {
        let mut inner = valid.clone();
        let object = inner
            .pointer_mut(pointer)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("{of}: {pointer} is no object of the payload"));
        object.insert(ODD.into(), json!(1));
        // `/files/0` is `files[0]` in a path.
        let path =
            pointer[1..]
                .split('/')
                .fold(String::new(), |path, part| match part.parse::<usize>() {
                    Ok(i) => format!("{path}[{i}]"),
                    Err(_) if path.is_empty() => part.to_string(),
                    Err(_) => format!("{path}.{part}"),
                });
        for (encoding, bytes) in encoded(&inner) {
            let unknown = refused::<T>(encoding, &bytes);
            assert_eq!(
                (unknown.field.as_str(), unknown.object.as_str()),
                (ODD, path.as_str()),
                "{of} {encoding:?}"
            );
            assert_eq!(unknown.path, format!("{path}.{ODD}"));
            assert!(
                unknown
                    .to_string()
                    .contains(&format!("in `{path}` of `{of}`")),
                "{unknown}"
            );
        }
    }
}

fn file() -> Value {
    json!({"path": "data/in.txt", "content": "aGk=", "encoding": "base64"})
}

fn upload() -> Value {
    json!({"upload_id": "u1", "chunks": 1, "sha256": "00"})
}

#[test]
fn executions_and_test_runs() {
    let exec = json!({
        "language": "python",
        "code": "print(1)",
        "limits": {"memory_mb": 128},
        "files": [file()],
        "network": {"allow_domains": ["pkgs.example.org"]},
    });
    strict::<ExecRequest>(
        "ExecRequest",
        exec.clone(),
        &["/limits", "/files/0", "/network"],
    );
    strict::<ResultGet>("ResultGet", json!({"execution_id": "e1"}), &[]);
    strict::<TestRequest>(
        "TestRequest",
        json!({"language": "python", "code": "x = 1", "tests": "def test(): pass",
               "limits": {}, "files": [file()]}),
        &["/limits", "/files/0"],
    );
    strict::<AssessRequest>(
        "AssessRequest",
        json!({"content": "x = 1", "content_type": "python", "files": [file()],
               "params": {"free": "form"}}),
        &["/files/0"],
    );
    // Internal: the scheduler's run carries the client's request, as strict as it came.
    strict::<ExecutorRun>(
        "ExecutorRun",
        json!({"execution_id": "e1", "tier": "ephemeral", "kind": "pooled", "request": exec,
               "network": {}, "template": {"name": "t", "image": {}}, "filesystem": {}}),
        &[
            "/request",
            "/request/network",
            "/network",
            "/template",
            "/template/image",
            "/filesystem",
        ],
    );
    strict::<ExecutorStatusQuery>("ExecutorStatusQuery", json!({"execution_id": "e1"}), &[]);
    strict::<ExecutorClose>("ExecutorClose", json!({"session_id": "s1"}), &[]);
    strict::<ExecutorDrain>("ExecutorDrain", json!({}), &[]);
    strict::<RunTemplate>(
        "RunTemplate",
        json!({"name": "t", "image": {}}),
        &["/image"],
    );
}

#[test]
fn sessions_ports_and_templates() {
    strict::<SessionOpen>(
        "SessionOpen",
        json!({"network": {"allow_domains": ["pkgs.example.org"]},
               "filesystem": {"deny_read": ["/etc/ssl/private"]}}),
        &["/network", "/filesystem"],
    );
    strict::<SessionTtl>("SessionTtl", json!({"session_id": "s1", "ttl_ms": 1}), &[]);
    strict::<SessionRef>("SessionRef", json!({"session_id": "s1"}), &[]);
    strict::<SessionList>("SessionList", json!({}), &[]);
    strict::<PortExpose>("PortExpose", json!({"session_id": "s1", "port": 8000}), &[]);
    strict::<PortRef>("PortRef", json!({"session_id": "s1"}), &[]);
    let tunnel = json!({"session_id": "s1", "port": 8000, "tunnel_id": "t1"});
    strict::<TunnelConnect>("TunnelConnect", tunnel.clone(), &[]);
    strict::<ExecutorTunnel>("ExecutorTunnel", tunnel, &[]);
    strict::<Template>(
        "Template",
        json!({"name": "t", "limits": {}, "network": {}, "files": [file()], "filesystem": {}}),
        &["/limits", "/network", "/files/0", "/filesystem"],
    );
    strict::<TemplateRef>("TemplateRef", json!({"name": "t"}), &[]);
    strict::<TemplateList>("TemplateList", json!({}), &[]);
}

#[test]
fn processes() {
    let start = json!({"session_id": "s1", "cmd": "npm run dev", "pty": {"cols": 80, "rows": 24}});
    strict::<ProcStart>("ProcStart", start.clone(), &["/pty"]);
    strict::<ProcStart>(
        "ProcStart",
        json!({"session_id": "s1", "argv": ["ls"]}),
        &[],
    );
    let ids = json!({"session_id": "s1", "proc_id": "p1"});
    let with = |extra: Value| {
        let mut v = ids.clone();
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    strict::<ProcRef>("ProcRef", ids.clone(), &[]);
    strict::<ProcOutputRequest>("ProcOutputRequest", ids.clone(), &[]);
    strict::<ProcInput>("ProcInput", with(json!({"data": "hi\n"})), &[]);
    strict::<ProcSignal>("ProcSignal", with(json!({"signal": "KILL"})), &[]);
    strict::<ProcWait>("ProcWait", ids.clone(), &[]);
    strict::<ProcResize>("ProcResize", with(json!({"cols": 80, "rows": 24})), &[]);
    // Internal, and internally tagged: serde reads the operation's fields after the tag, so
    // the field is named but not where it is.
    let call = json!({"op": "start", "proc_id": "p1", "output_subject": "o", "start": start});
    strict::<ProcCall>("ProcCall", call.clone(), &[]);
    strict::<ProcCall>("ProcCall", json!({"op": "list", "session_id": "s1"}), &[]);
    strict::<ProcCall>(
        "ProcCall",
        with(json!({"op": "signal", "signal": "KILL"})),
        &[],
    );
    let mut inner = call;
    inner["start"][ODD] = json!(1);
    let unknown = refused::<ProcCall>(Encoding::Json, &serde_json::to_vec(&inner).unwrap());
    assert_eq!(unknown.field, ODD);
}

/// The command is exactly one of two fields: both, or neither, is a 400 saying so.
#[test]
fn a_process_names_one_command() {
    for body in [
        json!({"session_id": "s1", "cmd": "ls", "argv": ["rm", "-rf", "/"]}),
        json!({"session_id": "s1"}),
    ] {
        let e = Encoding::Json
            .decode::<ProcStart>(body.to_string().as_bytes())
            .unwrap_err();
        let body = ErrorBody::from(e);
        assert_eq!(body.kind, ErrorKind::BadRequest);
        assert!(body.message.contains("exactly one of `cmd`"), "{body:?}");
    }
}

#[test]
fn workspaces() {
    let s = json!({"session_id": "s1"});
    let with = |extra: Value| {
        let mut v = s.clone();
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    strict::<WsInit>("WsInit", s.clone(), &[]);
    strict::<WsWrite>(
        "WsWrite",
        with(json!({"path": "a.txt", "content": "", "upload": upload()})),
        &["/upload"],
    );
    strict::<WsUploadChunk>(
        "WsUploadChunk",
        with(json!({"upload_id": "u1", "seq": 0, "data": ""})),
        &[],
    );
    strict::<UploadRef>("UploadRef", upload(), &[]);
    strict::<WsFetch>(
        "WsFetch",
        with(json!({"object": "o", "offset": 0, "length": 1})),
        &[],
    );
    strict::<WsRead>("WsRead", with(json!({"path": "a.txt"})), &[]);
    strict::<WsList>("WsList", s.clone(), &[]);
    strict::<WsPath>("WsPath", with(json!({"path": "a.txt"})), &[]);
    strict::<WsSnapshot>("WsSnapshot", s.clone(), &[]);
    strict::<WsRestore>("WsRestore", with(json!({"upload": upload()})), &["/upload"]);
    strict::<WsUsageRequest>("WsUsageRequest", s.clone(), &[]);
    strict::<WsCleanup>("WsCleanup", json!({}), &[]);
}

#[test]
fn confirmations_browsers_and_aio() {
    strict::<ConfirmRequest>(
        "ConfirmRequest",
        json!({"summary": "x", "files": [{"path": "a", "bytes": 1, "sha256": "00"}],
               "risk": {"level": "high", "suggested_tier": "session",
                        "an_assessor_field": "kept lenient"}}),
        &["/files/0"],
    );
    strict::<ConfirmDecide>(
        "ConfirmDecide",
        json!({"id": "c1", "approve": true, "by": "alice"}),
        &[],
    );
    strict::<ConfirmGet>("ConfirmGet", json!({"id": "c1"}), &[]);
    strict::<ConfirmList>("ConfirmList", json!({}), &[]);
    strict::<BrowserPayload>(
        "BrowserPayload",
        json!({"session_id": "s1", "url": "https://example.org/"}),
        &[],
    );
    strict::<AioAcquire>("AioAcquire", json!({"session_id": "s1"}), &[]);
    strict::<AioRelease>("AioRelease", json!({"session_id": "s1"}), &[]);
    strict::<AioExec>("AioExec", json!({"session_id": "s1", "command": "ls"}), &[]);
    strict::<AioStatsRequest>("AioStatsRequest", json!({}), &[]);
}

/// The mistake this rule is for, as the caller sees it: a 400 whose message names the field,
/// the object and what it takes, and whose details name the field's path.
#[test]
fn a_misspelt_policy_field_is_a_bad_request_naming_it() {
    let open = br#"{"session_id": "s1", "network": {"allow": ["pkgs.example.org"]}}"#;
    let body = ErrorBody::from(Encoding::Json.decode::<SessionOpen>(open).unwrap_err());
    assert_eq!((body.code, body.kind), (400, ErrorKind::BadRequest));
    assert_eq!(
        body.message,
        "unknown field `allow` in `network` of `SessionOpen` (expected one of: allow_domains, \
         deny_domains, allow_cidrs, allow_all, ports)"
    );
    assert_eq!(
        body.details,
        Some(json!({
            "field": "network.allow",
            "expected": ["allow_domains", "deny_domains", "allow_cidrs", "allow_all", "ports"],
        }))
    );
    // Positive control: the field's right name opens with the policy.
    let open = br#"{"session_id": "s1", "network": {"allow_domains": ["pkgs.example.org"]}}"#;
    let decoded: SessionOpen = Encoding::Json.decode(open).unwrap();
    assert_eq!(decoded.network.unwrap().allow_domains, ["pkgs.example.org"]);
}

/// A field name is the caller's: shown escaped and cut, so a hostile one can neither forge
/// lines in a log nor make the error larger than any reply may be.
#[test]
fn a_hostile_field_name_is_shown_escaped_and_cut() {
    let name = format!("a`, expected `b\n{}", "x".repeat(10_000));
    let mut network = serde_json::Map::new();
    network.insert(name.clone(), json!(1));
    let payload = json!({"session_id": "s1", "network": network});
    let e = Encoding::Json
        .decode::<SessionOpen>(payload.to_string().as_bytes())
        .unwrap_err();
    let CodecError::UnknownField(unknown) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(unknown.field, name, "the whole name, in the typed error");
    assert_eq!(unknown.expected.len(), 5, "{unknown:?}");
    let shown = e.to_string();
    assert!(shown.len() < 400, "{shown}");
    assert!(!shown.contains('\n') && shown.contains("\\n"), "{shown}");
    let body = serde_json::to_vec(&ErrorBody::from(e)).unwrap();
    assert!(body.len() < 1000, "{}", String::from_utf8_lossy(&body));
}

/// Replies are not request types: a newer server's field in one is read past, so a client
/// keeps reading the answers of servers newer than itself.
#[test]
fn replies_are_read_past_fields_they_do_not_know() {
    let result = json!({"execution_id": "e1", "status": "ok", "tier": "ephemeral",
                        "a_newer_field": {"any": "thing"}});
    let decoded: messages::exec::ExecResult = Encoding::Json
        .decode(result.to_string().as_bytes())
        .unwrap();
    assert_eq!(decoded.execution_id, "e1");
}
