//! A session's background processes over HTTP, and a terminal over the WebSocket, as a
//! program (or a browser's terminal widget) would use them, against the real mesh and Docker.

use futures::StreamExt;
use messages::proc::{ProcInfo, ProcList, ProcOutput};

use crate::common::{start_mesh, Gateway, BOUND};

type Ws = async_tungstenite::WebSocketStream<async_tungstenite::tokio::ConnectStream>;

async fn open_session(gw: &Gateway, key: &str, id: &str) {
    let open = serde_json::json!({"session_id": id, "tier": "session"});
    let r = gw.json("POST", "/api/v1/sessions", Some(key), &open).await;
    assert_eq!(r.status, 201, "{r:?}");
}

async fn connect_ws(gw: &Gateway, key: &str, path: &str) -> Result<Ws, String> {
    use async_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{}{path}", gw.addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    async_tungstenite::tokio::connect_async(request)
        .await
        .map(|(ws, _)| ws)
        .map_err(|e| e.to_string())
}

/// Reads terminal messages until the output so far contains `want`.
async fn read_until(ws: &mut Ws, seen: &mut String, want: &str) {
    let found = tokio::time::timeout(BOUND, async {
        while !seen.contains(want) {
            let msg = ws.next().await.expect("the terminal is open").unwrap();
            let frame: serde_json::Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
            match frame["type"].as_str() {
                Some("output") => seen.push_str(frame["data"].as_str().unwrap_or_default()),
                Some("exit") => panic!("the process exited: {frame}; output: {seen}"),
                _ => {}
            }
        }
    })
    .await;
    assert!(found.is_ok(), "{want:?} never came; output: {seen}");
}

fn send(text: serde_json::Value) -> async_tungstenite::tungstenite::Message {
    async_tungstenite::tungstenite::Message::text(text.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminal_over_the_websocket_echoes_and_resizes() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let acme = gw.key("acme");
    let other = gw.key("default");
    let id = format!("term-{}", messages::new_id().to_ascii_lowercase());
    open_session(&gw, &acme, &id).await;
    let start = serde_json::json!({"argv": ["bash", "--norc", "-i"], "pty": {"cols": 80, "rows": 24}, "tag": "shell"});
    let r = gw
        .json(
            "POST",
            &format!("/api/v1/sessions/{id}/processes"),
            Some(&acme),
            &start,
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let proc_id = r.json::<serde_json::Value>()["proc_id"]
        .as_str()
        .unwrap()
        .to_string();
    let ws_path = format!("/api/v1/sessions/{id}/procs/{proc_id}/ws");

    // Another tenant's key, an unknown process, a plain GET: refused before any upgrade.
    assert!(connect_ws(&gw, &other, &ws_path)
        .await
        .unwrap_err()
        .contains("404"));
    let unknown = format!("/api/v1/sessions/{id}/procs/nope/ws");
    assert!(connect_ws(&gw, &acme, &unknown)
        .await
        .unwrap_err()
        .contains("404"));
    let plain = gw.send("GET", &ws_path, Some(&acme), &[], "").await;
    assert_eq!(plain.status, 400, "{plain:?}");

    let mut ws = connect_ws(&gw, &acme, &ws_path).await.unwrap();
    let mut seen = String::new();
    ws.send(send(
        serde_json::json!({"type": "input", "data": "echo h''i\n"}),
    ))
    .await
    .unwrap();
    read_until(&mut ws, &mut seen, "hi\r\n").await;
    ws.send(send(
        serde_json::json!({"type": "input", "data": "stty size\n"}),
    ))
    .await
    .unwrap();
    read_until(&mut ws, &mut seen, "24 80").await;
    ws.send(send(
        serde_json::json!({"type": "resize", "cols": 100, "rows": 30}),
    ))
    .await
    .unwrap();
    ws.send(send(
        serde_json::json!({"type": "input", "data": "stty size\n"}),
    ))
    .await
    .unwrap();
    read_until(&mut ws, &mut seen, "30 100").await;

    // Ping, and a message that is not one: answered, the terminal goes on.
    ws.send(send(serde_json::json!({"type": "ping"})))
        .await
        .unwrap();
    ws.send(async_tungstenite::tungstenite::Message::text("{not json"))
        .await
        .unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        let msg = tokio::time::timeout(BOUND, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let frame: serde_json::Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
        if frame["type"] != "output" {
            kinds.push(frame["type"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(kinds, ["pong", "error"]);

    // The shell's end ends the socket with its status.
    ws.send(send(
        serde_json::json!({"type": "input", "data": "exit 3\n"}),
    ))
    .await
    .unwrap();
    let exit = tokio::time::timeout(BOUND, async {
        loop {
            let msg = ws.next().await.unwrap().unwrap();
            let frame: serde_json::Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
            if frame["type"] == "exit" {
                return frame;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(exit["exit_code"], 3, "{exit}");

    gw.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processes_over_http_start_list_read_write_and_die() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let acme = gw.key("acme");
    let k = Some(acme.as_str());
    let other = gw.key("default");
    let id = format!("procs-{}", messages::new_id().to_ascii_lowercase());
    open_session(&gw, &acme, &id).await;
    let base = format!("/api/v1/sessions/{id}/processes");

    // A reader of its stdin that answers each line.
    let start = serde_json::json!({"cmd": "while read l; do echo got:$l; done", "stdin": true, "tag": "echo"});
    let r = gw.json("POST", &base, k, &start).await;
    assert_eq!(r.status, 201, "{r:?}");
    let proc_id = r.json::<serde_json::Value>()["proc_id"]
        .as_str()
        .unwrap()
        .to_string();

    let listed: ProcList = gw.send("GET", &base, k, &[], "").await.json();
    assert!(listed
        .procs
        .iter()
        .any(|p| p.proc_id == proc_id && p.tag.as_deref() == Some("echo")));
    let r = gw.send("GET", &base, Some(&other), &[], "").await;
    assert_eq!(r.status, 404, "{r:?}");

    // A long poll that the input ends.
    let output = format!("{base}/{proc_id}/output?from_seq=0&wait_ms=20000");
    let poll = gw.send("GET", &output, k, &[], "");
    let write = async {
        let input = serde_json::json!({"data": "one\n"});
        let r = gw
            .json("POST", &format!("{base}/{proc_id}/input"), k, &input)
            .await;
        assert_eq!(r.status, 200, "{r:?}");
    };
    let (polled, ()) = tokio::join!(poll, write);
    assert_eq!(polled.status, 200, "{polled:?}");
    let mut text = String::new();
    let mut page: ProcOutput = polled.json();
    loop {
        for c in &page.chunks {
            text.push_str(&String::from_utf8(c.bytes().unwrap()).unwrap());
        }
        if text.contains("got:one") {
            break;
        }
        let next = format!(
            "{base}/{proc_id}/output?from_seq={}&wait_ms=5000",
            page.next_seq
        );
        page = gw.send("GET", &next, k, &[], "").await.json();
    }

    // Killed: the list says so once it is gone.
    let r = gw
        .send("DELETE", &format!("{base}/{proc_id}"), k, &[], "")
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let killed = test_support::eventually("the process to be killed", BOUND, || async {
        let listed: ProcList = gw.send("GET", &base, k, &[], "").await.json();
        listed.procs.into_iter().find(|p: &ProcInfo| {
            p.proc_id == proc_id && p.state != messages::proc::ProcState::Running
        })
    })
    .await;
    assert_eq!(
        killed.state,
        messages::proc::ProcState::Killed,
        "{killed:?}"
    );

    // Hostile and malformed requests: clear answers.
    for (body, status) in [
        (serde_json::json!({}), 400),
        (serde_json::json!({"argv": []}), 400),
        (
            serde_json::json!({"cmd": "x", "pty": {"cols": 0, "rows": 0}}),
            400,
        ),
        (serde_json::json!(["not", "an", "object"]), 400),
        (serde_json::json!({"cmd": "a".repeat(100 << 10)}), 413),
    ] {
        let r = gw.json("POST", &base, k, &body).await;
        assert_eq!(r.status, status, "{r:?}");
    }
    let r = gw
        .send(
            "GET",
            &format!("{base}/{proc_id}/output?wait_ms=999999"),
            k,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = gw
        .send(
            "GET",
            &format!("{base}/{proc_id}/output?from_seq=x"),
            k,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = gw
        .send("GET", &format!("{base}/nope/output"), k, &[], "")
        .await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = gw
        .json(
            "POST",
            "/api/v1/sessions/no-such/processes",
            k,
            &serde_json::json!({"cmd": "true"}),
        )
        .await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = gw
        .json(
            "POST",
            &format!("{base}/{proc_id}/input"),
            Some(&other),
            &serde_json::json!({"data": "x"}),
        )
        .await;
    assert_eq!(r.status, 404, "{r:?}");

    gw.stop().await;
    mesh.shutdown().await;
}
