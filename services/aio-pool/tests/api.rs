//! The AIO HTTP API an agent's SDK calls, against a real instance of the `sandmesh/aio`
//! image in Docker (hardened and networked as the pool starts one): jupyter sessions, code
//! and Node.js execution, the file text tools, shell `exec_dir`, the browser's page actions
//! (console, markdown, forms, file inputs and recording too) and screenshots; each with
//! malformed, oversized and hostile input.

use crate::common::instance::Instance;
use hyper::StatusCode;
use serde_json::{json, Value};

/// The stream text of one name in a Jupyter-shaped `outputs` list.
fn stream(outputs: &Value, name: &str) -> String {
    outputs
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["output_type"] == "stream" && o["name"] == name)
        .map(|o| o["text"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn jupyter_sessions_keep_state_isolate_and_survive_interrupts_and_kills() {
    let aio = Instance::start("jupyter").await;
    let (status, v) = aio
        .call(
            "/v1/jupyter/sessions/create",
            json!({"session_id": "a", "kernel_name": "python3"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["session_id"], "a");
    let exec =
        |session: &str, code: &str| json!({"code": code, "session_id": session, "timeout": 20});

    let (_, v) = aio
        .call("/v1/jupyter/execute", exec("a", "x = 41\nprint('set')"))
        .await;
    assert_eq!(v["success"], true, "{v}");
    assert_eq!(v["data"]["status"], "ok", "{v}");
    assert_eq!(stream(&v["data"]["outputs"], "stdout"), "set\n");
    let (_, v) = aio.call("/v1/jupyter/execute", exec("a", "x + 1")).await;
    let result = &v["data"]["outputs"][0];
    assert_eq!(result["output_type"], "execute_result", "{v}");
    assert_eq!(result["data"]["text/plain"], "42");
    assert_eq!(v["data"]["execution_count"], 2);

    // Rich representations come back typed.
    let (_, v) = aio
        .call(
            "/v1/jupyter/execute",
            exec(
                "a",
                "class T:\n    def _repr_html_(self): return '<b>t</b>'\ndisplay(T())",
            ),
        )
        .await;
    assert_eq!(
        v["data"]["outputs"][0]["output_type"], "display_data",
        "{v}"
    );
    assert_eq!(v["data"]["outputs"][0]["data"]["text/html"], "<b>t</b>");

    // Another session never sees `x`; an error is typed.
    let (_, v) = aio.call("/v1/jupyter/execute", exec("b", "x")).await;
    assert_eq!(v["data"]["status"], "error", "{v}");
    let error = v["data"]["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["output_type"] == "error")
        .unwrap();
    assert_eq!(error["ename"], "NameError");

    // An endless loop is interrupted at the timeout; the kernel and its state survive.
    let (_, v) = aio
        .call(
            "/v1/jupyter/execute",
            json!({"code": "while True: pass", "session_id": "a", "timeout": 1}),
        )
        .await;
    assert_eq!(v["data"]["status"], "timeout", "{v}");
    let (_, v) = aio.call("/v1/jupyter/execute", exec("a", "print(x)")).await;
    assert_eq!(stream(&v["data"]["outputs"], "stdout"), "41\n", "{v}");
    assert_eq!(v["data"]["state_lost"], false);

    // A kernel killed from inside is replaced; the next cell says the state is gone.
    let (_, v) = aio
        .call(
            "/v1/jupyter/execute",
            exec("a", "import os; os.kill(os.getpid(), 9)"),
        )
        .await;
    assert_eq!(v["data"]["status"], "error", "{v}");
    let (_, v) = aio
        .call("/v1/jupyter/execute", exec("a", "print('x' in dir())"))
        .await;
    assert_eq!(v["data"]["state_lost"], true, "{v}");
    assert_eq!(stream(&v["data"]["outputs"], "stdout"), "False\n");

    // The kernel never holds the instance's key.
    let (_, v) = aio
        .call(
            "/v1/jupyter/execute",
            exec("a", "import os; print(os.environ.get('SANDBOX_API_KEY'))"),
        )
        .await;
    assert_eq!(stream(&v["data"]["outputs"], "stdout"), "None\n");

    let (_, v) = aio.call_raw("GET", "/v1/jupyter/sessions", vec![]).await;
    let sessions = v["data"]["sessions"].as_object().unwrap();
    assert!(
        sessions.contains_key("a") && sessions.contains_key("b"),
        "{v}"
    );
    let (status, _) = aio
        .call_raw("DELETE", "/v1/jupyter/sessions/b", vec![])
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = aio
        .call_raw("DELETE", "/v1/jupyter/sessions/b", vec![])
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, v) = aio.call_raw("GET", "/v1/jupyter/info", vec![]).await;
    assert_eq!(v["data"]["default_kernel"], "python3");

    // Malformed and hostile input.
    for (body, why) in [
        (
            json!({"code": "1", "session_id": "../../etc"}),
            "session id",
        ),
        (
            json!({"code": "1", "session_id": "x".repeat(500)}),
            "long id",
        ),
        (json!({"code": "1", "kernel_name": "bash"}), "kernel"),
        (json!({"code": "1", "timeout": -5}), "timeout"),
        (json!({"code": "1", "cwd": "/nonexistent"}), "cwd"),
        (json!({"no_code": 1}), "schema"),
    ] {
        let (status, v) = aio.call("/v1/jupyter/execute", body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{why}: {v}");
        assert_eq!(v["success"], false);
    }
    let (status, _) = aio
        .call_raw("POST", "/v1/jupyter/execute", b"{not json".to_vec())
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let status = aio.send_oversized("/v1/jupyter/execute", 17 << 20).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    // A flood of output is cut at the cap, not buffered whole.
    let (_, v) = aio
        .call("/v1/jupyter/execute", exec("a", "print('y' * (8 << 20))"))
        .await;
    let printed = stream(&v["data"]["outputs"], "stdout");
    assert!(
        printed.len() <= 1 << 20 && printed.starts_with("yyy"),
        "{}",
        printed.len()
    );
    assert_eq!(v["data"]["truncated"], true);
    aio.stop().await;
}

#[tokio::test]
async fn code_and_nodejs_execute_statelessly_and_in_sessions() {
    let aio = Instance::start("code").await;
    let (_, v) = aio
        .call(
            "/v1/code/execute",
            json!({"language": "python", "code": "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"}),
        )
        .await;
    let data = &v["data"];
    assert_eq!(
        (
            &data["stdout"],
            &data["stderr"],
            &data["exit_code"],
            &data["status"]
        ),
        (&json!("out\n"), &json!("err\n"), &json!(3), &json!("error")),
        "{v}"
    );
    let (_, v) = aio
        .call(
            "/v1/code/execute",
            json!({"language": "javascript", "code": "console.log([1,2].map(x => x * 21).join(','))"}),
        )
        .await;
    assert_eq!(v["data"]["stdout"], "21,42\n", "{v}");
    assert_eq!(v["data"]["status"], "ok");
    for code in ["n = 5", "print(n * 2)"] {
        let (_, v) = aio
            .call(
                "/v1/code/execute",
                json!({"language": "python", "code": code, "stateful": true, "session_id": "c1"}),
            )
            .await;
        assert_eq!(v["data"]["session_id"], "c1", "{v}");
        if code.starts_with("print") {
            assert_eq!(v["data"]["stdout"], "10\n", "{v}");
        }
    }
    let (_, v) = aio
        .call(
            "/v1/code/execute",
            json!({"language": "python", "code": "import time; time.sleep(30)", "timeout": 1}),
        )
        .await;
    assert_eq!(v["data"]["status"], "timeout", "{v}");

    let (_, v) = aio
        .call(
            "/v1/nodejs/execute",
            json!({
                "code": "const fs = require('fs'); let s = ''; process.stdin.on('data', d => s += d); \
                         process.stdin.on('end', () => console.log(s.trim() + ':' + fs.readFileSync('lib/data.txt', 'utf8')))",
                "stdin": "in",
                "files": {"lib/data.txt": "file"},
            }),
        )
        .await;
    assert_eq!(v["data"]["stdout"], "in:file\n", "{v}");
    assert_eq!(v["data"]["exit_code"], 0);
    // A stateful Node.js session keeps its globals, top-level await included.
    let node = |code: &str| json!({"code": code, "stateful": true, "session_id": "n1"});
    let (_, v) = aio
        .call(
            "/v1/nodejs/execute",
            node("let base = await Promise.resolve(40)"),
        )
        .await;
    assert_eq!(v["data"]["status"], "ok", "{v}");
    let (_, v) = aio.call("/v1/nodejs/execute", node("base + 2")).await;
    assert_eq!(v["data"]["outputs"][0]["data"]["text/plain"], "42", "{v}");
    // A Python session's id is not a Node.js one.
    let (status, _) = aio
        .call(
            "/v1/nodejs/execute",
            json!({"code": "1", "stateful": true, "session_id": "c1"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    for (path, body) in [
        ("/v1/code/execute", json!({"language": "ruby", "code": "1"})),
        ("/v1/code/execute", json!({"language": "python"})),
        (
            "/v1/nodejs/execute",
            json!({"code": "1", "files": {"../../escape.js": "x"}}),
        ),
        (
            "/v1/nodejs/execute",
            json!({"code": "1", "files": {"/etc/evil": "x"}}),
        ),
    ] {
        let (status, v) = aio.call(path, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
    }
    let (status, v) = aio
        .call(
            "/v1/shell/exec",
            json!({"command": "for f in /escape.js /home/escape.js /etc/evil; do [ -e $f ] && echo $f; done; echo checked"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["data"]["output"], "checked\n", "{v}");
    let (_, v) = aio.call_raw("GET", "/v1/code/info", vec![]).await;
    assert_eq!(v["data"]["languages"].as_array().unwrap().len(), 2);
    aio.stop().await;
}

#[tokio::test]
async fn file_text_tools_edit_inside_the_workspace_only() {
    let aio = Instance::start("files").await;
    let (_, v) = aio
        .call(
            "/v1/file/write",
            json!({"file": "/home/gem/src/app.py", "content": "a = 1\nb = a\na = 2\n"}),
        )
        .await;
    assert_eq!(v["success"], true, "{v}");
    let (_, v) = aio
        .call(
            "/v1/file/replace",
            json!({"file": "/home/gem/src/app.py", "old_str": "a =", "new_str": "z ="}),
        )
        .await;
    assert_eq!(v["data"]["replaced_count"], 2, "{v}");
    let (_, v) = aio
        .call(
            "/v1/file/search",
            json!({"file": "/home/gem/src/app.py", "regex": "^z = \\d"}),
        )
        .await;
    assert_eq!(v["data"]["line_numbers"], json!([0, 2]), "{v}");
    let (_, v) = aio
        .call(
            "/v1/file/find",
            json!({"path": "/home/gem", "glob": "**/*.py"}),
        )
        .await;
    assert_eq!(v["data"]["files"], json!(["/home/gem/src/app.py"]), "{v}");

    let editor = |body: Value| aio.call("/v1/file/str_replace_editor", body);
    let (_, v) =
        editor(json!({"command": "create", "path": "/home/gem/e.txt", "file_text": "one\ntwo\n"}))
            .await;
    assert_eq!(v["data"]["prev_exist"], false, "{v}");
    let (_, v) = editor(json!({"command": "str_replace", "path": "/home/gem/e.txt", "old_str": "two", "new_str": "2"})).await;
    assert_eq!(v["data"]["new_content"], "one\n2\n", "{v}");
    let (_, v) =
        editor(json!({"command": "view", "path": "/home/gem/e.txt", "view_range": [2, -1]})).await;
    assert!(
        v["data"]["output"]
            .as_str()
            .unwrap()
            .ends_with("     2\t2\n"),
        "{v}"
    );
    let (_, v) = editor(json!({"command": "undo_edit", "path": "/home/gem/e.txt"})).await;
    assert_eq!(v["data"]["new_content"], "one\ntwo\n", "{v}");
    let (_, v) =
        editor(json!({"command": "str_replace", "path": "/home/gem/e.txt", "old_str": "absent"}))
            .await;
    assert_eq!(v["success"], false, "{v}");
    assert_eq!(v["data"]["error_type"], "invalid_argument");

    // Outside the workspace, through `..` or a symlink: refused, nothing changed.
    aio.call(
        "/v1/shell/exec",
        json!({"command": "ln -s /etc /home/gem/etc-link"}),
    )
    .await;
    for (path, body) in [
        (
            "/v1/file/replace",
            json!({"file": "/etc/passwd", "old_str": "root", "new_str": "x"}),
        ),
        (
            "/v1/file/replace",
            json!({"file": "../../etc/passwd", "old_str": "root", "new_str": "x"}),
        ),
        (
            "/v1/file/search",
            json!({"file": "etc-link/passwd", "regex": "root"}),
        ),
        ("/v1/file/find", json!({"path": "/etc", "glob": "*"})),
        (
            "/v1/file/str_replace_editor",
            json!({"command": "view", "path": "/etc/passwd"}),
        ),
        (
            "/v1/file/str_replace_editor",
            json!({"command": "create", "path": "/tmp/x", "file_text": "x"}),
        ),
    ] {
        let (status, v) = aio.call(path, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(v["success"], false, "{body}: {v}");
        assert!(
            matches!(
                v["data"]["error_type"].as_str(),
                Some("permission_denied" | "invalid_argument")
            ),
            "{body}: {v}"
        );
    }
    // Bad patterns are refused; a pattern that backtracks exponentially elsewhere is linear
    // here.
    let (_, v) = aio
        .call(
            "/v1/file/search",
            json!({"file": "e.txt", "regex": "(unclosed"}),
        )
        .await;
    assert_eq!(v["success"], false, "{v}");
    aio.call(
        "/v1/file/write",
        json!({"file": "a.txt", "content": format!("{}!", "a".repeat(100_000))}),
    )
    .await;
    let (_, v) = aio
        .call(
            "/v1/file/search",
            json!({"file": "a.txt", "regex": "^(a+)+$"}),
        )
        .await;
    assert_eq!(v["data"]["matches"], json!([]), "{v}");
    for (path, body) in [
        (
            "/v1/file/str_replace_editor",
            json!({"command": "rm", "path": "e.txt"}),
        ),
        ("/v1/file/replace", json!({"file": "e.txt"})),
        ("/v1/file/find", json!({"glob": "*"})),
    ] {
        let (status, _) = aio.call(path, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    for path in [
        "/v1/file/replace",
        "/v1/file/str_replace_editor",
        "/v1/nodejs/execute",
    ] {
        let status = aio.send_oversized(path, 17 << 20).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}");
    }
    aio.stop().await;
}

#[tokio::test]
async fn shell_exec_runs_in_any_absolute_directory() {
    let aio = Instance::start("execdir").await;
    for (dir, expect) in [
        ("/etc", "/etc\n"),
        ("/tmp", "/tmp\n"),
        ("/home/gem", "/home/gem\n"),
    ] {
        let (status, v) = aio
            .call("/v1/shell/exec", json!({"command": "pwd", "exec_dir": dir}))
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["data"]["output"], expect);
    }
    for dir in ["/nonexistent", "/etc/passwd", "../../tmp"] {
        let (status, v) = aio
            .call("/v1/shell/exec", json!({"command": "pwd", "exec_dir": dir}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{dir}: {v}");
    }
    aio.stop().await;
}

const FORM_PAGE: &str = "data:text/html,<title>Form</title><input id=name><select id=s>\
<option value=a>A</option><option value=b>B</option></select><input id=c type=checkbox>\
<button id=go onclick=\"document.getElementById('out').textContent='hi '+document.getElementById('name').value\">Go</button>\
<p id=out></p><div style='height:3000px'></div>";

#[tokio::test]
async fn browser_page_actions_screenshots_and_cdp_discovery() {
    let aio = Instance::start("page").await;
    let (status, v) = aio
        .call("/v1/browser/page/navigate", json!({"url": FORM_PAGE}))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["title"], "Form");
    let (_, v) = aio
        .call(
            "/v1/browser/page/fill",
            json!({"selector": "#name", "text": "ann"}),
        )
        .await;
    assert_eq!(v["success"], true, "{v}");
    let (_, v) = aio
        .call(
            "/v1/browser/page/select_option",
            json!({"selector": "#s", "value": "b"}),
        )
        .await;
    assert_eq!(v["data"]["value"], "b", "{v}");
    aio.call("/v1/browser/page/check", json!({"selector": "#c"}))
        .await;
    let (_, v) = aio
        .call_raw("GET", "/v1/browser/page/elements", vec![])
        .await;
    let elements = v["data"].as_array().unwrap();
    let go = elements
        .iter()
        .find(|e| e["text"] == "Go")
        .expect("the button is listed");
    let (status, v) = aio
        .call("/v1/browser/page/click", json!({"index": go["index"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, v) = aio
        .call("/v1/browser/page/wait", json!({"type": "function", "expression": "document.getElementById('out').textContent !== ''", "timeout": 5}))
        .await;
    assert_eq!(v["success"], true, "{v}");
    let (_, v) = aio.call_raw("GET", "/v1/browser/page/text", vec![]).await;
    assert!(v["data"].as_str().unwrap().contains("hi ann"), "{v}");
    let (_, v) = aio
        .call(
            "/v1/browser/page/evaluate",
            json!({"expression": "[document.getElementById('c').checked, 6 * 7]"}),
        )
        .await;
    assert_eq!(v["data"], json!([true, 42]), "{v}");
    aio.call("/v1/browser/page/click", json!({"selector": "#name"}))
        .await;
    aio.call("/v1/browser/page/type", json!({"text": "!"}))
        .await;
    aio.call("/v1/browser/page/press_key", json!({"key": "Backspace"}))
        .await;
    aio.call("/v1/browser/page/type", json!({"text": "?"}))
        .await;
    let (_, v) = aio
        .call(
            "/v1/browser/page/evaluate",
            json!({"expression": "document.getElementById('name').value"}),
        )
        .await;
    assert_eq!(v["data"], "ann?", "{v}");
    let (_, v) = aio
        .call(
            "/v1/browser/page/scroll",
            json!({"direction": "down", "amount": 500}),
        )
        .await;
    assert_eq!(v["data"]["y"], 500, "{v}");
    let (_, v) = aio.call_raw("GET", "/v1/browser/page/html", vec![]).await;
    assert!(v["data"].as_str().unwrap().contains("<title>Form</title>"));
    let (_, v) = aio
        .call("/v1/browser/page/find_text", json!({"keyword": "hi ann"}))
        .await;
    assert_eq!(v["data"][0]["tag"], "p", "{v}");
    aio.call("/v1/browser/page/navigate", json!({"url": "about:blank"}))
        .await;
    let (_, v) = aio.call("/v1/browser/page/back", json!({})).await;
    assert_eq!(v["data"]["title"], "Form", "{v}");

    let (status, png) = aio.send("GET", "/v1/browser/screenshot", vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let (_, jpeg) = aio
        .send(
            "GET",
            "/v1/browser/page/screenshot?format=jpeg&quality=50&full_page=true",
            vec![],
        )
        .await;
    assert!(jpeg.starts_with(b"\xff\xd8\xff"), "not a JPEG");

    // Playwright's connect_over_cdp(http_url) asks for /json/version/ (trailing slash).
    let (status, with_slash) = aio.call_raw("GET", "/json/version/", vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let (_, without) = aio.call_raw("GET", "/json/version", vec![]).await;
    assert_eq!(with_slash, without);
    assert!(with_slash["webSocketDebuggerUrl"]
        .as_str()
        .unwrap()
        .starts_with(&format!("ws://{}/devtools/browser/", aio.addr)));

    // Hostile and malformed input gets clear errors.
    for (path, body, expect) in [
        (
            "/v1/browser/page/navigate",
            json!({"url": "javascript:alert(1)"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/browser/page/navigate",
            json!({"nourl": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/browser/page/click",
            json!({"selector": "#absent"}),
            StatusCode::NOT_FOUND,
        ),
        // Not spliced into the script: an invalid selector, not code.
        (
            "/v1/browser/page/click",
            json!({"selector": "\"); document.title = 'pwned'; (\""}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/browser/page/click",
            json!({"selector": "[[["}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/browser/page/click",
            json!({}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/browser/page/evaluate",
            json!({"expression": "throw new Error('boom')"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/browser/page/press_key",
            json!({"key": "NoSuchKey"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "/v1/browser/page/wait",
            json!({"type": "selector", "selector": "#never", "timeout": 0.5}),
            StatusCode::GATEWAY_TIMEOUT,
        ),
    ] {
        let (status, v) = aio.call(path, body.clone()).await;
        assert_eq!(status, expect, "{path} {body}: {v}");
        assert_eq!(v["success"], false);
    }
    let (_, v) = aio
        .call(
            "/v1/browser/page/evaluate",
            json!({"expression": "document.title"}),
        )
        .await;
    assert_eq!(v["data"], "Form", "{v}");
    let (status, _) = aio
        .send("GET", "/v1/browser/screenshot?format=gif", vec![])
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = aio
        .send("GET", "/v1/browser/screenshot?quality=500", vec![])
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = aio
        .call_raw("POST", "/v1/browser/page/fill", b"[1,2".to_vec())
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    aio.stop().await;
}

/// A page with something for each of the later actions: console messages at load, content
/// for Markdown (and a hidden part that must not show), a form, two file inputs and an
/// animation (so a recording gets frames). No `#` or `%`: it is a data URL.
const APP_PAGE: &str = "data:text/html,<title>App</title>\
<style>@keyframes spin{from{transform:rotate(0deg)}to{transform:rotate(360deg)}} \
.spin{width:80px;height:80px;background:red;animation:spin 1s linear infinite}</style>\
<h1>Sign up</h1><p>Fill <b>every</b> field, see <a href='https://example.org/terms'>the terms</a>.</p>\
<ul><li>one</li><li>two</li></ul><table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>\
<div style='display:none'>secret-hidden</div>\
<form><input id=name><input id=agree type=checkbox>\
<select id=color><option value=r>Red</option><option value=b>Blue</option></select>\
<input type=radio name=size id=small value=s><input type=radio name=size id=large value=l>\
<textarea id=notes></textarea><input id=one type=file><input id=many type=file multiple></form>\
<div class=spin></div>\
<script>console.log('loaded', 42); console.warn('careful')</script>";

/// The texts of the page's own `console.<kind>` entries.
fn console_texts(entries: &Value, kind: &str) -> Vec<String> {
    entries
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == kind && e["source"] == "console")
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn browser_page_console_markdown_forms_uploads_and_recording() {
    let aio = Instance::start("page2").await;
    for (file, content) in [("up/a.txt", "alpha"), ("up/b.txt", "beta")] {
        let (_, v) = aio
            .call("/v1/file/write", json!({"file": file, "content": content}))
            .await;
        assert_eq!(v["success"], true, "{v}");
    }
    let (_, v) = aio
        .call(
            "/v1/shell/exec",
            json!({"command": "ln -s /etc/passwd up/link && mkdir -p logs"}),
        )
        .await;
    assert_eq!(v["data"]["exit_code"], 0, "{v}");
    let (status, v) = aio
        .call("/v1/browser/page/navigate", json!({"url": APP_PAGE}))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    // Console: what the page logged at load is there on the first read.
    let (status, v) = aio
        .call_raw("GET", "/v1/browser/page/console", vec![])
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(console_texts(&v["data"], "log"), ["loaded 42"], "{v}");
    assert_eq!(console_texts(&v["data"], "warning"), ["careful"], "{v}");
    aio.call(
        "/v1/browser/page/evaluate",
        json!({"expression": "console.error('boom', 7, true); 0"}),
    )
    .await;
    let (_, v) = aio
        .call_raw("GET", "/v1/browser/page/console?clear=true", vec![])
        .await;
    assert_eq!(console_texts(&v["data"], "error"), ["boom 7 true"], "{v}");
    let (_, v) = aio
        .call_raw("GET", "/v1/browser/page/console", vec![])
        .await;
    assert_eq!(v["data"], json!([]), "cleared: {v}");
    aio.call(
        "/v1/browser/page/evaluate",
        json!({"expression": "console.info('to the file'); 0"}),
    )
    .await;
    let (status, v) = aio
        .call(
            "/v1/browser/page/console/export",
            json!({"save_path": "logs/console.json", "clear": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["count"], 1, "{v}");
    let (_, v) = aio
        .call("/v1/file/read", json!({"file": "logs/console.json"}))
        .await;
    let exported: Value = serde_json::from_str(v["data"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        console_texts(&exported, "info"),
        ["to the file"],
        "{exported}"
    );

    // Markdown of the rendered page: structure kept, hidden parts and scripts left out.
    let (status, v) = aio
        .call_raw("GET", "/v1/browser/page/markdown", vec![])
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["title"], "App");
    assert_eq!(v["data"]["truncated"], false);
    let markdown = v["data"]["markdown"].as_str().unwrap();
    for part in [
        "# Sign up",
        "Fill **every** field, see [the terms](https://example.org/terms).",
        "- one\n- two",
        "| a | b |\n| --- | --- |\n| 1 | 2 |",
    ] {
        assert!(markdown.contains(part), "{part:?} in {markdown}");
    }
    assert!(!markdown.contains("secret-hidden"), "{markdown}");
    assert!(!markdown.contains("console.log"), "{markdown}");

    // fill_form: every kind of field in one call; the value reaches the page as data.
    let hostile = "'); document.title = 'pwned'; ('";
    let (status, v) = aio
        .call(
            "/v1/browser/page/fill_form",
            json!({"items": [
                {"selector": "#name", "value": hostile},
                {"selector": "#agree", "value": true},
                {"selector": "#color", "value": "Blue"},
                {"selector": "#large", "value": true},
                {"selector": "#notes", "text": "two\nlines"},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["filled"], 5, "{v}");
    let state = "[document.title, ...['name', 'agree', 'color', 'large', 'notes'].map((id) => \
                 { const el = document.getElementById(id); return el.type === 'checkbox' || el.type === 'radio' ? el.checked : el.value; })]";
    let (_, v) = aio
        .call("/v1/browser/page/evaluate", json!({"expression": state}))
        .await;
    assert_eq!(
        v["data"],
        json!(["App", hostile, true, "b", true, "two\nlines"]),
        "{v}"
    );
    // One missing element: nothing is filled.
    let (status, v) = aio
        .call(
            "/v1/browser/page/fill_form",
            json!({"items": [{"selector": "#name", "value": "changed"}, {"selector": "#absent", "value": 1}]}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert!(v["message"].as_str().unwrap().contains("item 1"), "{v}");
    let (_, v) = aio
        .call(
            "/v1/browser/page/evaluate",
            json!({"expression": "document.getElementById('name').value"}),
        )
        .await;
    assert_eq!(v["data"], hostile, "untouched: {v}");
    let many: Vec<Value> = (0..101)
        .map(|_| json!({"selector": "#name", "value": "x"}))
        .collect();
    for (body, expect) in [
        (json!({"items": []}), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({"items": many}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            json!({"items": [{"selector": "#name"}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"items": [{"value": "x"}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"items": [{"selector": "[[[", "value": "x"}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"items": [{"selector": "#color", "value": "Green"}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"items": [{"selector": "#one", "value": "/etc/passwd"}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!({"items": "name"}), StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let (status, v) = aio.call("/v1/browser/page/fill_form", body.clone()).await;
        assert_eq!(status, expect, "{body}: {v}");
        assert_eq!(v["success"], false);
    }

    // upload_file: workspace files only, into a file input.
    let (status, v) = aio
        .call(
            "/v1/browser/page/upload_file",
            json!({"selector": "#many", "files": ["up/a.txt", "/home/gem/up/b.txt"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["files"], json!(["a.txt", "b.txt"]), "{v}");
    let (_, v) = aio
        .call(
            "/v1/browser/page/evaluate",
            json!({"expression": "Promise.all([...document.getElementById('many').files].map((f) => f.text()))"}),
        )
        .await;
    assert_eq!(
        v["data"],
        json!(["alpha", "beta"]),
        "the page reads them: {v}"
    );
    for (selector, file, expect) in [
        ("#one", "../../etc/passwd", StatusCode::FORBIDDEN),
        ("#one", "/etc/passwd", StatusCode::FORBIDDEN),
        ("#one", "up/link", StatusCode::FORBIDDEN),
        ("#one", "up/missing.txt", StatusCode::NOT_FOUND),
        ("#one", "up", StatusCode::UNPROCESSABLE_ENTITY),
        ("#name", "up/a.txt", StatusCode::UNPROCESSABLE_ENTITY),
        ("#absent", "up/a.txt", StatusCode::NOT_FOUND),
        ("[[[", "up/a.txt", StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let body = json!({"selector": selector, "files": [file]});
        let (status, v) = aio.call("/v1/browser/page/upload_file", body.clone()).await;
        assert_eq!(status, expect, "{body}: {v}");
    }
    for body in [
        json!({"selector": "#one", "files": ["up/a.txt", "up/b.txt"]}),
        json!({"selector": "#one", "files": []}),
        json!({"selector": "#one"}),
    ] {
        let (status, v) = aio.call("/v1/browser/page/upload_file", body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
    }
    let (_, v) = aio
        .call(
            "/v1/browser/page/evaluate",
            json!({"expression": "document.getElementById('one').files.length"}),
        )
        .await;
    assert_eq!(v["data"], 0, "no refused file reached the input: {v}");

    // Console export: the same path rules.
    for (path, expect) in [
        ("../../tmp/x.json", StatusCode::FORBIDDEN),
        ("/etc/cron.d/x", StatusCode::FORBIDDEN),
        ("up/link", StatusCode::FORBIDDEN),
    ] {
        let (status, v) = aio
            .call(
                "/v1/browser/page/console/export",
                json!({"save_path": path}),
            )
            .await;
        assert_eq!(status, expect, "{path}: {v}");
    }
    let (status, _) = aio.call("/v1/browser/page/console/export", json!({})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = aio
        .call_raw("GET", "/v1/browser/page/console?clear=maybe", vec![])
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // Recording: start, frames arrive while the page animates, pause, resume, stop.
    let record = |body: Value| aio.call("/v1/browser/page/record", body);
    let (_, v) = record(json!({"action": "status"})).await;
    assert_eq!(v["data"]["status"], "idle", "{v}");
    let (status, v) =
        record(json!({"action": "start", "save_path": "rec/a.avi", "fps": 5, "duration": 60}))
            .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["status"], "recording", "{v}");
    let (status, _) = record(json!({"action": "start"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "one recording at a time");
    test_support::eventually(
        "the screencast sends frames of the animation",
        std::time::Duration::from_secs(20),
        || async {
            let (_, v) = aio
                .call("/v1/browser/page/record", json!({"action": "status"}))
                .await;
            (v["data"]["frames"].as_u64()? >= 3).then_some(())
        },
    )
    .await;
    let (_, v) = record(json!({"action": "pause"})).await;
    assert_eq!(v["data"]["status"], "paused", "{v}");
    let (_, v) = record(json!({"action": "resume"})).await;
    assert_eq!(v["data"]["status"], "recording", "{v}");
    let (status, v) = record(json!({"action": "stop"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["status"], "stopped", "{v}");
    assert_eq!(v["data"]["save_path"], "/home/gem/rec/a.avi", "{v}");
    let size = v["data"]["file_size_bytes"].as_u64().unwrap();
    let (status, avi) = aio
        .send("GET", "/v1/file/download?path=rec/a.avi", vec![])
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(avi.len() as u64, size);
    assert_valid_mjpeg_avi(&avi);

    let (status, v) =
        record(json!({"action": "once", "duration": 1, "fps": 4, "save_path": "rec/once.avi"}))
            .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["status"], "stopped", "{v}");
    let (_, avi) = aio
        .send("GET", "/v1/file/download?path=rec/once.avi", vec![])
        .await;
    assert_valid_mjpeg_avi(&avi);
    let (status, _) = record(json!({"action": "pause"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "nothing to pause");
    for body in [
        json!({"action": "once", "save_path": "../../tmp/x.avi"}),
        json!({"action": "start", "save_path": "/tmp/x.avi"}),
        json!({"action": "start", "save_path": "up/link"}),
    ] {
        let (status, v) = record(body.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}: {v}");
    }
    for body in [
        json!({"action": "start", "fps": 0}),
        json!({"action": "start", "fps": 1000}),
        json!({"action": "start", "duration": -1}),
        json!({"action": "start", "duration": 1e9}),
        json!({"action": "start", "quality": 101}),
        json!({"action": "explode"}),
        json!({"action": "start", "fps": "fast"}),
    ] {
        let (status, v) = record(body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
    }
    let (_, v) = record(json!({"action": "status"})).await;
    assert_eq!(
        v["data"]["status"], "stopped",
        "nothing refused started: {v}"
    );

    for path in [
        "/v1/browser/page/fill_form",
        "/v1/browser/page/upload_file",
        "/v1/browser/page/record",
        "/v1/browser/page/console/export",
    ] {
        let status = aio.send_oversized(path, 17 << 20).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}");
        let (status, _) = aio.call_raw("POST", path, b"{\"items\": [".to_vec()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}");
    }
    aio.stop().await;
}

/// RIFF AVI with an MJPEG stream whose first frame is a JPEG.
fn assert_valid_mjpeg_avi(avi: &[u8]) {
    assert_eq!(&avi[..4], b"RIFF");
    assert_eq!(&avi[8..12], b"AVI ");
    let le = |at: usize| u32::from_le_bytes(avi[at..at + 4].try_into().unwrap()) as usize;
    assert_eq!(le(4), avi.len() - 8, "RIFF size");
    let find = |tag: &[u8]| avi.windows(4).position(|w| w == tag);
    assert!(find(b"MJPG").is_some(), "an MJPEG stream");
    let avih = find(b"avih").expect("avih") + 8;
    assert!(le(avih + 16) >= 1, "frames in the header");
    let movi = find(b"movi").expect("movi");
    assert_eq!(&avi[movi + 4..movi + 8], b"00dc");
    assert_eq!(&avi[movi + 12..movi + 15], b"\xff\xd8\xff", "a JPEG frame");
    assert!(find(b"idx1").is_some(), "an index");
}
