//! The connection's framing and error paths against a real WebSocket server (tokio +
//! async-tungstenite's server side) that plays Chromium badly on purpose.

use std::future::Future;
use std::time::Duration;

use async_tungstenite::tokio::{accept_async, accept_hdr_async, TokioAdapter};
use async_tungstenite::tungstenite::handshake::server::{Request, Response};
use async_tungstenite::tungstenite::Message;
use async_tungstenite::WebSocketStream;
use cdp::{CdpError, Connection, MAX_PENDING_EVENTS};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Socket = WebSocketStream<TokioAdapter<TcpStream>>;

const LIMIT: Duration = Duration::from_secs(5);

/// A server for one connection, played by `script`; returns its `ws://` URL.
async fn serve<F, Fut>(script: F) -> String
where
    F: FnOnce(Socket) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        script(accept_async(stream).await.unwrap()).await;
    });
    format!("ws://{addr}/devtools/page/test")
}

/// The next command the client sent.
async fn command(socket: &mut Socket) -> Value {
    loop {
        match socket.next().await.expect("a command").expect("a frame") {
            Message::Text(text) => return serde_json::from_str(&text).unwrap(),
            _ => continue,
        }
    }
}

async fn send(socket: &mut Socket, value: Value) {
    socket
        .send(Message::Text(value.to_string().into()))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_answer_comes_back_after_events_and_noise_with_its_session() {
    let url = serve(|mut socket| async move {
        let asked = command(&mut socket).await;
        assert_eq!(asked["method"], "Runtime.evaluate");
        assert_eq!(asked["sessionId"], "s1");
        send(
            &mut socket,
            json!({"method": "Page.loadEventFired", "params": {}}),
        )
        .await;
        socket.send(Message::Text("not json".into())).await.unwrap();
        socket
            .send(Message::Binary(vec![1, 2, 3].into()))
            .await
            .unwrap();
        // A late answer to an earlier id is skipped.
        send(&mut socket, json!({"id": 999, "result": {"late": true}})).await;
        send(&mut socket, json!({"id": asked["id"], "result": {"ok": 1}})).await;
        // Keep the socket open until the client is done.
        let _ = socket.next().await;
    })
    .await;
    let mut conn = Connection::open(&url, LIMIT).await.unwrap();
    let answer = conn
        .call_in(Some("s1"), "Runtime.evaluate", json!({"expression": "1"}))
        .await
        .unwrap();
    assert_eq!(answer, json!({"ok": 1}));
    assert!(!conn.is_closed());
    assert_eq!(
        conn.drain_events().count(),
        0,
        "events are dropped unless kept"
    );
}

#[tokio::test]
async fn a_socket_that_closes_mid_command_is_closed_and_stays_so() {
    let url = serve(|mut socket| async move {
        command(&mut socket).await;
        socket.close(None).await.unwrap();
    })
    .await;
    let mut conn = Connection::open(&url, LIMIT).await.unwrap();
    let e = conn.call("Page.navigate", json!({})).await.unwrap_err();
    assert!(matches!(e, CdpError::Closed), "{e:?}");
    assert!(conn.is_closed());
    // The next call fails at once instead of waiting for a bound.
    let e = conn.call("Page.reload", json!({})).await.unwrap_err();
    assert!(matches!(e, CdpError::Closed), "{e:?}");
}

#[tokio::test]
async fn an_answer_that_never_comes_is_a_timeout_naming_the_method() {
    let url = serve(|mut socket| async move {
        command(&mut socket).await;
        // Silence, the socket open, until the client gives up and goes.
        while socket.next().await.is_some() {}
    })
    .await;
    let limit = Duration::from_millis(300);
    let mut conn = Connection::open(&url, limit).await.unwrap();
    let e = conn
        .call("Page.captureScreenshot", json!({}))
        .await
        .unwrap_err();
    match e {
        CdpError::Timeout { method, limit: l } => {
            assert_eq!(method, "Page.captureScreenshot");
            assert_eq!(l, limit);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn an_error_answer_is_a_protocol_error_with_chromiums_message() {
    let url = serve(|mut socket| async move {
        let asked = command(&mut socket).await;
        send(
            &mut socket,
            json!({"id": asked["id"], "error": {"code": -32601, "message": "'Nope.nope' wasn't found"}}),
        )
        .await;
        let _ = socket.next().await;
    })
    .await;
    let mut conn = Connection::open(&url, LIMIT).await.unwrap();
    let e = conn.call("Nope.nope", json!({})).await.unwrap_err();
    match &e {
        CdpError::Protocol { method, message } => {
            assert_eq!(method, "Nope.nope");
            assert_eq!(message, "'Nope.nope' wasn't found");
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert!(
        !conn.is_closed(),
        "an error answer leaves the socket usable"
    );
}

#[tokio::test]
async fn a_flood_of_events_keeps_only_the_newest_up_to_the_cap() {
    let flood = MAX_PENDING_EVENTS * 3;
    let url = serve(move |mut socket| async move {
        let asked = command(&mut socket).await;
        for n in 0..flood {
            send(
                &mut socket,
                json!({"method": "Runtime.consoleAPICalled", "params": {"n": n}}),
            )
            .await;
        }
        send(&mut socket, json!({"id": asked["id"], "result": {}})).await;
        send(
            &mut socket,
            json!({"method": "Log.entryAdded", "params": {}}),
        )
        .await;
        let _ = socket.next().await;
    })
    .await;
    let mut conn = Connection::open(&url, LIMIT).await.unwrap();
    conn.keep_events();
    conn.call("Runtime.enable", json!({})).await.unwrap();
    let kept: Vec<Value> = conn.drain_events().collect();
    assert_eq!(kept.len(), MAX_PENDING_EVENTS);
    assert_eq!(kept[0]["params"]["n"], flood - MAX_PENDING_EVENTS);
    assert_eq!(kept.last().unwrap()["params"]["n"], flood - 1);
    // After the answer, events are read one by one.
    let next = conn.next_event().await.unwrap();
    assert_eq!(next["method"], "Log.entryAdded");
}

#[tokio::test]
async fn a_url_that_is_not_a_websocket_is_refused_and_a_silent_port_times_out() {
    for url in ["http://127.0.0.1:9222/", "ws://", "127.0.0.1:9222"] {
        let e = Connection::open(url, LIMIT).await.err().unwrap();
        assert!(matches!(e, CdpError::Url(_)), "{url}: {e:?}");
    }
    // Accepts TCP, never answers the handshake.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move { listener.accept().await });
    let url = format!("ws://{addr}/devtools/browser/x");
    let e = Connection::open(&url, Duration::from_millis(300))
        .await
        .err()
        .unwrap();
    assert!(matches!(e, CdpError::Timeout { .. }), "{e:?}");
    hold.abort();
}

/// Answers one HTTP request on `listener` with `body`, returning the request's head.
async fn answer_http(listener: &TcpListener, body: &str) -> String {
    let (mut stream, _) = listener.accept().await.unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "the request ended early");
        head.extend_from_slice(&buf[..n]);
    }
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await.unwrap();
    String::from_utf8_lossy(&head).into_owned()
}

#[tokio::test]
async fn the_browser_socket_is_reached_at_the_address_that_answered_json_version() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        // Chromium names itself 127.0.0.1:9222 whatever address it was reached at.
        let head = answer_http(
            &listener,
            r#"{"Browser": "Chrome/1", "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/abc"}"#,
        )
        .await;
        let (stream, _) = listener.accept().await.unwrap();
        let mut path = String::new();
        // tungstenite's callback type fixes the (large) error type.
        #[allow(clippy::result_large_err)]
        let socket = accept_hdr_async(stream, |req: &Request, res: Response| {
            path = req.uri().path().to_string();
            Ok(res)
        })
        .await
        .unwrap();
        drop(socket);
        (head, path)
    });
    let conn = Connection::browser(&format!("http://{addr}"), LIMIT).await;
    assert!(conn.is_ok(), "{:?}", conn.err());
    let (head, path) = server.await.unwrap();
    assert!(head.starts_with("GET /json/version "), "{head}");
    assert!(head.contains(&format!("host: {addr}")), "{head}");
    assert_eq!(path, "/devtools/browser/abc");
}

#[tokio::test]
async fn a_json_version_without_a_socket_or_not_json_is_a_clear_error() {
    for (body, want) in [("{\"Browser\": \"x\"}", "Missing"), ("<html>", "Json")] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { answer_http(&listener, body).await });
        let e = Connection::browser(&format!("http://{addr}"), LIMIT)
            .await
            .err()
            .unwrap();
        let got = format!("{e:?}");
        assert!(got.starts_with(want), "{body}: {got}");
        server.await.unwrap();
    }
    // Nothing listens: an HTTP error naming the address and path.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let e = Connection::browser(&format!("http://{addr}"), LIMIT)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, CdpError::Http { path, .. } if path == "/json/version"),
        "{e:?}"
    );
}
