//! Kernel cells: a session's Python kernel keeps its variables between cells,
//! returns typed rich outputs, survives a timeout (interrupted, not killed), restarts after
//! its death with `state_lost`, and is never shared between sessions.

use std::time::Duration;

use crate::common::{run, DockerRuns, Harness};
use messages::exec::{ContentEncoding, ExecResult, ExecStatus, Language, OutputKind};
use messages::subjects::ExecutorOp;

async fn cell(h: &Harness, session: &str, code: &str) -> ExecResult {
    cell_within(h, session, code, 10_000).await
}

async fn cell_within(h: &Harness, session: &str, code: &str, timeout_ms: u64) -> ExecResult {
    let mut r = run(Some(session), Language::Python, code);
    r.edit_request(|r| r.kernel = true);
    r.edit_request(|r| r.timeout_ms = Some(timeout_ms));
    h.call_node(&r).await.expect("kernel cell")
}

/// A 2x1 RGB PNG built with the standard library only (zlib + struct), as a cell's
/// `_repr_png_` returns it.
const PNG_CELL: &str = r#"
import struct, zlib
def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
class Swatch:
    def _repr_png_(self):
        raw = b"\x00\xff\x00\x00\x00\x00\xff"
        return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0))
                + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b""))
Swatch()
"#;

/// Checks the PNG signature and every chunk's CRC (what a decoder checks first).
fn assert_valid_png(bytes: &[u8]) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let mut at = 8;
    let mut kinds = Vec::new();
    while at < bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let body = &bytes[at + 4..at + 8 + len];
        let crc = u32::from_be_bytes(bytes[at + 8 + len..at + 12 + len].try_into().unwrap());
        assert_eq!(crc32(body), crc, "chunk CRC");
        kinds.push(String::from_utf8_lossy(&body[..4]).into_owned());
        at += 12 + len;
    }
    assert_eq!(kinds, ["IHDR", "IDAT", "IEND"]);
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_share_state_and_return_typed_outputs() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let s = "kernel-state";

    let r = cell(&h, s, "x = 41").await;
    assert_eq!(
        (r.status, r.stdout.as_str(), r.state_lost),
        (ExecStatus::Ok, "", false),
        "{r:?}"
    );
    let r = cell(
        &h,
        s,
        "print(x + 1)\nimport os\nos.system('echo from a child')\nx",
    )
    .await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(r.stdout, "42\nfrom a child\n", "{r:?}");
    assert_eq!(r.outputs.len(), 1, "{r:?}");
    assert_eq!(r.outputs[0].kind, OutputKind::Result);
    assert_eq!(
        (
            r.outputs[0].mime_type.as_str(),
            r.outputs[0].content.as_deref()
        ),
        ("text/plain", Some("41"))
    );

    let r = cell(&h, s, PNG_CELL).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let png = r
        .outputs
        .iter()
        .find(|o| o.mime_type == "image/png")
        .unwrap_or_else(|| panic!("an image/png output: {r:?}"));
    assert_eq!(png.encoding, ContentEncoding::Base64);
    let bytes = messages::decode_content(png.content.as_deref().expect("inline"), png.encoding)
        .expect("base64");
    assert_valid_png(&bytes);

    // display(), JSON, and an output too large to travel inline: a file under artifacts/.
    let r = cell(
        &h,
        s,
        "class Page:\n    def _repr_html_(self): return '<p>' + 'x' * 300000 + '</p>'\n\
         class Data:\n    def _repr_json_(self): return {'a': [1, 2]}\n\
         display(Data(), Page())\n\
         import os\nprint(os.path.getsize('artifacts/' + os.listdir('artifacts')[0]) > 300000)",
    )
    .await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(r.stdout, "True\n", "{r:?}");
    let json = r.outputs.iter().find(|o| o.mime_type == "application/json");
    assert_eq!(
        json.and_then(|o| o.content.as_deref()),
        Some(r#"{"a": [1, 2]}"#),
        "{r:?}"
    );
    let html = r
        .outputs
        .iter()
        .find(|o| o.mime_type == "text/html")
        .expect("html");
    assert_eq!(html.kind, OutputKind::Display);
    assert!(html.content.is_none(), "large outputs are files: {html:?}");
    let path = html.path.as_deref().expect("an artifact path");
    assert!(
        path.starts_with("artifacts/") && path.ends_with(".html"),
        "{path}"
    );

    let r = cell(&h, s, "def f():\n    return 1 / 0\nf()").await;
    assert_eq!(
        (r.status, r.exit_code),
        (ExecStatus::Error, Some(1)),
        "{r:?}"
    );
    let e = r.cell_error.as_ref().expect("the cell's exception");
    assert_eq!(
        (e.name.as_str(), e.value.as_str()),
        ("ZeroDivisionError", "division by zero")
    );
    assert!(e.traceback.iter().any(|l| l.contains("in f")), "{e:?}");
    assert!(r.stderr.contains("ZeroDivisionError"), "{r:?}");

    // What a cell starts dies with it; the kernel stays, also through a plain execution.
    let r = cell(
        &h,
        s,
        "import subprocess\nsubprocess.Popen(['sleep', '1000'])\n0",
    )
    .await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let container = h.session_container(s).await;
    let strays = h.stray_processes(&container).await;
    assert!(
        strays.iter().all(|(_, cmd)| cmd.starts_with("python3 -c")),
        "only the kernel outlives a cell: {strays:?}"
    );
    let r = h.session(s, Language::Shell, "echo plain").await;
    assert_eq!(r.stdout, "plain\n", "{r:?}");
    let r = cell(&h, s, "print(x)").await;
    assert_eq!((r.stdout.as_str(), r.state_lost), ("41\n", false), "{r:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_interrupts_the_cell_and_the_kernel_keeps_its_state() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let s = "kernel-timeout";
    let r = cell(&h, s, "kept = 'still here'").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");

    let r = cell_within(&h, s, "while True:\n    pass", 1000).await;
    assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    assert_eq!(
        r.cell_error.as_ref().map(|e| e.name.as_str()),
        Some("KeyboardInterrupt"),
        "{r:?}"
    );
    let r = cell(&h, s, "print(kept)").await;
    assert_eq!(
        (r.status, r.stdout.as_str(), r.state_lost),
        (ExecStatus::Ok, "still here\n", false),
        "the kernel lived through the interrupt: {r:?}"
    );

    // A cell that ignores the interrupt loses its kernel; the next cell gets a new one.
    let r = cell_within(
        &h,
        s,
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
        1000,
    )
    .await;
    assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    let r = cell(&h, s, "print('kept' in globals())").await;
    assert_eq!(
        (r.status, r.stdout.as_str(), r.state_lost),
        (ExecStatus::Ok, "False\n", true),
        "{r:?}"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_kernel_restarts_and_says_its_state_was_lost() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let s = "kernel-killed";
    let r = cell(&h, s, "z = 1").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let r = cell(
        &h,
        s,
        "import os\nprint('bye', flush=True)\nos.kill(os.getpid(), 9)",
    )
    .await;
    assert_eq!(r.status, ExecStatus::Killed, "{r:?}");
    assert_eq!(r.stdout, "bye\n", "{r:?}");

    let r = cell(&h, s, "print('z' in globals())\nz = 2").await;
    assert_eq!(
        (r.status, r.stdout.as_str(), r.state_lost),
        (ExecStatus::Ok, "False\n", true),
        "{r:?}"
    );
    let r = cell(&h, s, "print(z)").await;
    assert_eq!(
        (r.stdout.as_str(), r.state_lost),
        ("2\n", false),
        "the new kernel keeps state: {r:?}"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_never_share_a_kernel() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let r = cell(&h, "kernel-a", "secret = 'only a'").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let r = cell(&h, "kernel-b", "print('secret' in globals())").await;
    assert_eq!(
        (r.status, r.stdout.as_str(), r.state_lost),
        (ExecStatus::Ok, "False\n", false),
        "{r:?}"
    );
    let r = cell(&h, "kernel-a", "print(secret)").await;
    assert_eq!(r.stdout, "only a\n", "{r:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_cells_share_state_await_and_are_interrupted() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let s = "kernel-js";
    let js = |code: &str, timeout_ms: u64| {
        let mut r = run(Some(s), Language::Javascript, code);
        r.edit_request(|r| r.kernel = true);
        r.edit_request(|r| r.timeout_ms = Some(timeout_ms));
        r
    };
    let r = h.call_node(&js("let x = 41", 10_000)).await.unwrap();
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let code = "console.log(x + 1)\nrequire('child_process').execSync('echo child', {stdio: 'inherit'})\nx";
    let r = h.call_node(&js(code, 10_000)).await.unwrap();
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "42\nchild\n"),
        "{r:?}"
    );
    assert_eq!(r.outputs[0].content.as_deref(), Some("41"), "{r:?}");

    let code = "const y = await new Promise(done => setTimeout(() => done(x + 1), 10))\nreturn y";
    let r = h.call_node(&js(code, 10_000)).await.unwrap();
    assert_eq!(r.outputs[0].content.as_deref(), Some("42"), "{r:?}");

    let r = h.call_node(&js("while (true) {}", 1000)).await.unwrap();
    assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    let r = h
        .call_node(&js("throw new TypeError('bad ' + y)", 10_000))
        .await
        .unwrap();
    assert_eq!(r.status, ExecStatus::Error, "{r:?}");
    let e = r.cell_error.as_ref().expect("the cell's exception");
    assert_eq!(
        (e.name.as_str(), e.value.as_str(), r.state_lost),
        ("TypeError", "bad 42", false),
        "the kernel kept its state through the interrupt: {r:?}"
    );
    // The Python kernel of the same session is another interpreter.
    let r = cell(&h, s, "print('x' in globals())").await;
    assert_eq!(r.stdout, "False\n", "{r:?}");
    h.stop().await;
}

/// Matplotlib is in the built-in `python-data` template: the cells run in its image (built by
/// the executor on first use when missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matplotlib_figures_come_back_as_png_without_being_saved() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let data = messages::template::builtins()
        .into_iter()
        .find(|t| t.name == "python-data")
        .expect("the python-data built-in");
    let plot = |code: &str| {
        let mut r = run(Some("kernel-plot"), Language::Python, code);
        r.edit_request(|r| r.kernel = true);
        r.edit_request(|r| r.timeout_ms = Some(60_000));
        r.template = Some(messages::template::RunTemplate {
            name: data.name.clone(),
            image: data.image_spec(),
            warm_pool: Some(0),
        });
        r
    };
    // The first run may build the template's image (minutes): it answers when it has.
    let subject = h.subjects.executor_node(&h.node, ExecutorOp::Run);
    let r: ExecResult = h
        .caller
        .request_timeout(
            subject,
            &plot("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('cell')"),
            Duration::from_secs(1200),
        )
        .await
        .expect("a cell in python-data");
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let png = r
        .outputs
        .iter()
        .find(|o| o.mime_type == "image/png")
        .unwrap_or_else(|| panic!("the figure as image/png: {r:?}"));
    let bytes = messages::decode_content(png.content.as_deref().expect("inline"), png.encoding)
        .expect("base64");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let r = h
        .call_node(&plot("print(len(plt.get_fignums()))"))
        .await
        .expect("a second cell");
    assert_eq!(r.stdout, "0\n", "figures are closed after capture: {r:?}");
    h.stop().await;
}
