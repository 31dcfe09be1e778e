//! Preview ports end to end: servers in a real session container (background processes started
//! through the HTTP API), reached through the gateway over the NATS tunnel, with keys, tokens
//! and cookies of the right and the wrong tenant, and the attacks on the way in.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use messages::ports::{ExposedPort, PortList};

use crate::common::{start_mesh, Gateway, Mesh, BOUND};

/// A session id that survives a browser's lowercasing of host names, unique on this host.
fn session_id(what: &str) -> String {
    format!("{what}-{}", messages::new_id().to_ascii_lowercase())
}

/// Opens a session (tier session), puts `files` in its workspace and starts `argv` in it as a
/// background process (which places its container), through the HTTP API as a user would.
async fn serve_in_session(
    gw: &Gateway,
    key: &str,
    id: &str,
    files: &[(&str, &str)],
    argv: &[&str],
) {
    let k = Some(key);
    let open = serde_json::json!({"session_id": id, "tier": "session"});
    let r = gw.json("POST", "/api/v1/sessions", k, &open).await;
    assert_eq!(r.status, 201, "{r:?}");
    for (path, text) in files {
        let url = format!("/api/v1/sessions/{id}/files/{path}");
        let r = gw.send("PUT", &url, k, &[], text.to_string()).await;
        assert!(r.status < 300, "{r:?}");
    }
    start_process(gw, key, id, argv).await;
}

async fn start_process(gw: &Gateway, key: &str, id: &str, argv: &[&str]) -> String {
    let start = serde_json::json!({"argv": argv});
    let r = gw
        .json(
            "POST",
            &format!("/api/v1/sessions/{id}/processes"),
            Some(key),
            &start,
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    r.json::<serde_json::Value>()["proc_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The container of a session (for a test that reads a file of it from outside).
fn container_of(scoped_session: &str) -> String {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label=sandmesh.session={scoped_session}"),
        ])
        .output()
        .expect("the docker CLI (apt install docker.io)");
    let container = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(
        !container.is_empty(),
        "no container for session {scoped_session}"
    );
    container
}

fn docker_cat(container: &str, path: &str) -> Option<String> {
    let out = std::process::Command::new("docker")
        .args(["exec", container, "cat", path])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

const HTTP_SERVER: [&str; 6] = [
    "python3",
    "-m",
    "http.server",
    "8000",
    "--bind",
    "127.0.0.1",
];

async fn expose(gw: &Gateway, key: &str, id: &str, body: serde_json::Value) -> ExposedPort {
    let r = gw
        .json(
            "POST",
            &format!("/api/v1/sessions/{id}/ports"),
            Some(key),
            &body,
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    r.json()
}

/// `GET path` with this `Host` (as a browser sends it for `{port}-{session}.localhost`) and
/// cookie.
async fn get_as_host(gw: &Gateway, host: &str, path: &str, cookie: &str) -> (u16, Bytes) {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header("host", host)
        .header("cookie", cookie)
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = tokio::time::timeout(BOUND, sender.send_request(request))
        .await
        .unwrap()
        .unwrap();
    let status = response.status().as_u16();
    let body = tokio::time::timeout(BOUND, response.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    (status, body)
}

/// A forged token: the right tenant, another secret.
fn forged(token: &str) -> String {
    let (tenant, secret) = token.split_once('.').unwrap();
    let flipped = if secret.starts_with('0') { '1' } else { '0' };
    format!("{tenant}.{flipped}{}", &secret[1..])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_in_a_session_is_reached_through_the_gateway_and_nobody_else_reaches_it() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let acme = gw.key("acme");
    let other = gw.key("default");
    let id = session_id("web");
    serve_in_session(&gw, &acme, &id, &[("hello.txt", "hi\n")], &HTTP_SERVER).await;
    let root = format!("/api/v1/sessions/{id}/ports/8000/");

    // Never exposed: not found, even with the right key and a server listening.
    let r = gw.send("GET", &root, Some(&acme), &[], "").await;
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.problem().kind, "not_found");

    let exposed = expose(&gw, &acme, &id, serde_json::json!({"port": 8000})).await;
    assert!(exposed.url.ends_with(&root), "{exposed:?}");
    let token = exposed.token.clone().expect("expose answers the token");

    // The listing through the gateway (the server may still be starting).
    let listing = test_support::eventually("the listing through the tunnel", BOUND, || async {
        let r = gw.send("GET", &root, Some(&acme), &[], "").await;
        (r.status == 200).then_some(r)
    })
    .await;
    let body = String::from_utf8_lossy(&listing.body);
    assert!(body.contains("hello.txt"), "{body}");
    let r = gw
        .send("GET", &format!("{root}hello.txt"), Some(&acme), &[], "")
        .await;
    assert_eq!((r.status, &r.body[..]), (200, &b"hi\n"[..]), "{r:?}");
    let r = gw
        .send(
            "GET",
            &format!("/api/v1/sessions/{id}/ports/8000"),
            Some(&acme),
            &[],
            "",
        )
        .await;
    assert_eq!((r.status, r.header("location")), (308, Some(root.as_str())));
    // A browser's token rides in the query: the redirect keeps it.
    let r = gw
        .send(
            "GET",
            &format!("/api/v1/sessions/{id}/ports/8000?sandmesh_token=t"),
            None,
            &[],
            "",
        )
        .await;
    let with_token = format!("{root}?sandmesh_token=t");
    assert_eq!(
        (r.status, r.header("location")),
        (308, Some(with_token.as_str()))
    );

    // Another tenant's key: the session does not exist for it.
    let r = gw.send("GET", &root, Some(&other), &[], "").await;
    assert_eq!(r.status, 404, "{r:?}");

    // The token for a browser: in the query (answered with the cookie), then as the cookie.
    let r = gw
        .send(
            "GET",
            &format!("{root}?sandmesh_token={token}"),
            None,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let cookie = r
        .header("set-cookie")
        .expect("the token's cookie")
        .to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains(&format!("Path={root}")),
        "{cookie}"
    );
    let with_cookie = format!("sandmesh_token={token}");
    let r = gw
        .send(
            "GET",
            &format!("{root}hello.txt"),
            None,
            &[("cookie", &with_cookie)],
            "",
        )
        .await;
    assert_eq!((r.status, &r.body[..]), (200, &b"hi\n"[..]), "{r:?}");

    // Host routing: `{port}-{session}.localhost`, any path, the token as a cookie.
    let host = format!("8000-{id}.localhost:{}", gw.addr.port());
    let (status, body) = get_as_host(&gw, &host, "/hello.txt", &with_cookie).await;
    assert_eq!((status, &body[..]), (200, &b"hi\n"[..]));

    // Forged, malformed, missing and other tenants' credentials.
    for bad in [forged(&token), "acme.1234".into(), "nonsense".into()] {
        let r = gw
            .send(
                "GET",
                &format!("{root}?sandmesh_token={bad}"),
                None,
                &[],
                "",
            )
            .await;
        assert_eq!(r.status, 401, "{bad}: {r:?}");
    }
    // A token naming another tenant is checked as that tenant's: it has no such session.
    let foreign = token.replacen("acme", "default", 1);
    let r = gw
        .send(
            "GET",
            &format!("{root}?sandmesh_token={foreign}"),
            None,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = gw.send("GET", &root, None, &[], "").await;
    assert_eq!(r.status, 401, "{r:?}");
    let r = gw.send("GET", &root, Some("not-a-key"), &[], "").await;
    assert_eq!(r.status, 401, "{r:?}");

    // An expired token (a TTL of 1 ms) is refused like a forged one.
    let short = expose(
        &gw,
        &acme,
        &id,
        serde_json::json!({"port": 8000, "ttl_ms": 1}),
    )
    .await;
    let r = gw
        .send(
            "GET",
            &format!("{root}?sandmesh_token={}", short.token.unwrap()),
            None,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 401, "{r:?}");
    // It replaced the port's token: the first one stopped working too.
    let r = gw
        .send(
            "GET",
            &format!("{root}?sandmesh_token={token}"),
            None,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 401, "{r:?}");
    let fresh = expose(&gw, &acme, &id, serde_json::json!({"port": 8000})).await;
    let fresh_token = fresh.token.unwrap();
    let r = gw
        .send(
            "GET",
            &format!("{root}?sandmesh_token={fresh_token}"),
            None,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");

    // Exposed, nothing listening: unavailable, and said so.
    expose(&gw, &acme, &id, serde_json::json!({"port": 8001})).await;
    let r = gw
        .send(
            "GET",
            &format!("/api/v1/sessions/{id}/ports/8001/"),
            Some(&acme),
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 503, "{r:?}");
    assert!(
        r.problem().detail.contains("nothing listens on port 8001"),
        "{r:?}"
    );

    let r = gw
        .send(
            "GET",
            &format!("/api/v1/sessions/{id}/ports"),
            Some(&acme),
            &[],
            "",
        )
        .await;
    let listed: PortList = r.json();
    let mut ports: Vec<u16> = listed.ports.iter().map(|p| p.port).collect();
    ports.sort();
    assert_eq!(ports, [8000, 8001]);
    assert!(listed.ports.iter().all(|p| p.token.is_none()), "{listed:?}");

    // Unexposed: the token stops working, the key finds nothing.
    let r = gw
        .send(
            "DELETE",
            &format!("/api/v1/sessions/{id}/ports/8000"),
            Some(&acme),
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 204, "{r:?}");
    let r = gw
        .send(
            "GET",
            &format!("{root}?sandmesh_token={fresh_token}"),
            None,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 401, "{r:?}");
    let r = gw.send("GET", &root, Some(&acme), &[], "").await;
    assert_eq!(r.status, 404, "{r:?}");

    gw.stop().await;
    mesh.shutdown().await;
}

/// A WebSocket echo server of the standard library's parts, one thread per client.
const WS_ECHO: &str = r#"
import base64, hashlib, socket, threading
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(c):
    f = c.makefile("rb")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        b = f.read(1)
        if not b:
            return
        head += b
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while True:
        h = f.read(2)
        if len(h) < 2:
            return
        op, n = h[0] & 15, h[1] & 127
        if n == 126:
            n = int.from_bytes(f.read(2), "big")
        elif n == 127:
            n = int.from_bytes(f.read(8), "big")
        mask = f.read(4)
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        hdr = bytes([0x80 | op])
        if n < 126:
            hdr += bytes([n])
        elif n < 65536:
            hdr += bytes([126]) + n.to_bytes(2, "big")
        else:
            hdr += bytes([127]) + n.to_bytes(8, "big")
        c.sendall(hdr + data)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765))
s.listen()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_websocket_behind_a_port_echoes_through_the_gateway() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let acme = gw.key("acme");
    let id = session_id("ws");
    serve_in_session(
        &gw,
        &acme,
        &id,
        &[("echo.py", WS_ECHO)],
        &["python3", "echo.py"],
    )
    .await;
    expose(&gw, &acme, &id, serde_json::json!({"port": 8765})).await;

    let url = format!("ws://{}/api/v1/sessions/{id}/ports/8765/echo", gw.addr);
    let mut socket = test_support::eventually("the WebSocket to connect", BOUND, || async {
        let mut request =
            async_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                url.as_str(),
            )
            .unwrap();
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {acme}").parse().unwrap());
        async_tungstenite::tokio::connect_async(request)
            .await
            .ok()
            .map(|(s, _)| s)
    })
    .await;
    use async_tungstenite::tungstenite::Message;
    for text in ["hello", &"x".repeat(200_000)] {
        socket.send(Message::text(text)).await.unwrap();
        let back = tokio::time::timeout(BOUND, socket.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(back.into_text().unwrap().as_str(), text);
    }
    socket
        .send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .unwrap();
    let back = tokio::time::timeout(BOUND, socket.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(back.into_data().as_ref(), &[0u8, 1, 2, 255]);
    socket.close(None).await.unwrap();

    gw.stop().await;
    mesh.shutdown().await;
}

/// Streams `TOTAL` bytes to each client, writing how many it handed the kernel so far.
const FLOOD: &str = r#"
import os, socket
TOTAL = 128 << 20
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8766))
s.listen()
chunk = bytes(range(256)) * 256
while True:
    c, _ = s.accept()
    f = c.makefile("rb")
    while f.readline() not in (b"\r\n", b""):
        pass
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % TOTAL)
    sent = 0
    while sent < TOTAL:
        c.sendall(chunk)
        sent += len(chunk)
        with open("/tmp/sent.new", "w") as out:
            out.write(str(sent))
        os.replace("/tmp/sent.new", "/tmp/sent")
    c.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_that_stops_stops_the_server_and_loses_nothing() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let acme = gw.key("acme");
    let id = session_id("flood");
    serve_in_session(
        &gw,
        &acme,
        &id,
        &[("flood.py", FLOOD)],
        &["python3", "flood.py"],
    )
    .await;
    let container = container_of(&format!("acme-{id}"));
    expose(&gw, &acme, &id, serde_json::json!({"port": 8766})).await;
    let path = format!("/api/v1/sessions/{id}/ports/8766/");
    let response = test_support::eventually("the flood to start", BOUND, || async {
        let r = gw.open("GET", &path, Some(&acme), &[], Bytes::new()).await;
        (r.status() == 200).then_some(r)
    })
    .await;

    // Nothing read: the server is held back by the credit windows and the socket buffers on
    // the way, far short of the whole stream.
    let mut last = String::new();
    let held = test_support::eventually("the server to stop writing", BOUND, || {
        let now = docker_cat(&container, "/tmp/sent").unwrap_or_default();
        let same = !now.is_empty() && now == last;
        last = now.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            same.then_some(now)
        }
    })
    .await;
    let held: u64 = held.trim().parse().unwrap();
    assert!(
        held < 48 << 20,
        "the server wrote {held} bytes with nobody reading"
    );

    // Then everything arrives, in order.
    use http_body_util::BodyExt;
    let body = tokio::time::timeout(BOUND, response.into_body().collect())
        .await
        .expect("the rest within the bound")
        .unwrap()
        .to_bytes();
    assert_eq!(body.len(), 128 << 20);
    let pattern: Vec<u8> = (0..=255u8).collect();
    assert!(
        body.chunks(256).all(|c| c == &pattern[..]),
        "bytes out of order or lost"
    );

    gw.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_requests_get_clear_answers() {
    let mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let acme = gw.key("acme");
    let k = Some(acme.as_str());
    let id = session_id("hostile");
    serve_in_session(&gw, &acme, &id, &[], &["sleep", "600"]).await;
    let ports = format!("/api/v1/sessions/{id}/ports");

    // Malformed ports, sessions, bodies.
    for (body, status) in [
        (serde_json::json!({"port": 0}), 400),
        (serde_json::json!({"port": 65536}), 400),
        (serde_json::json!({"port": 8000, "ttl_ms": 0}), 400),
        (
            serde_json::json!({"port": 8000, "ttl_ms": 86_400_001u64}),
            400,
        ),
        (serde_json::json!({"port": "8000"}), 400),
    ] {
        let r = gw.json("POST", &ports, k, &body).await;
        assert_eq!(r.status, status, "{body}: {r:?}");
    }
    let r = gw
        .send(
            "POST",
            &ports,
            k,
            &[("content-type", "application/json")],
            "{nope",
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    let huge = format!("{{\"port\": 8000, \"x\": \"{}\"}}", "a".repeat(9 << 20));
    let r = gw
        .send(
            "POST",
            &ports,
            k,
            &[("content-type", "application/json")],
            huge,
        )
        .await;
    assert_eq!(r.status, 413, "{r:?}");
    for path in [
        format!("/api/v1/sessions/{id}/ports/0/"),
        format!("/api/v1/sessions/{id}/ports/70000/"),
        format!("/api/v1/sessions/{id}/ports/http/"),
        "/api/v1/sessions/bad.id/ports/8000/".to_string(),
    ] {
        let r = gw.send("GET", &path, k, &[], "").await;
        assert_eq!(r.status, 400, "{path}: {r:?}");
    }
    let r = gw
        .send(
            "GET",
            "/api/v1/sessions/no-such-session/ports/8000/",
            k,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = gw
        .json(
            "POST",
            "/api/v1/sessions/no-such-session/ports",
            k,
            &serde_json::json!({"port": 8000}),
        )
        .await;
    assert_eq!(r.status, 404, "{r:?}");

    // A request head far past any reason: refused before it reaches anything. The server
    // answers 431 and closes; a client still writing may see the close (a reset) first, so
    // either is the answer, and no tunnel is opened for it.
    let head = format!(
        "GET {ports}/8000/ HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {acme}\r\nx-big: {}\r\n\r\n",
        gw.addr,
        "b".repeat(1 << 20)
    );
    let mut raw = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let answer = tokio::time::timeout(BOUND, async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = raw.write_all(head.as_bytes()).await;
        let mut got = Vec::new();
        let _ = raw.read_to_end(&mut got).await;
        got
    })
    .await
    .expect("an oversized head is answered or closed, never left hanging");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );

    // A session whose runs each get a single-use sandbox has no port to expose.
    let single = session_id("single");
    let open = serde_json::json!({"session_id": single, "tier": "ephemeral"});
    assert_eq!(
        gw.json("POST", "/api/v1/sessions", k, &open).await.status,
        201
    );
    let r = gw
        .json(
            "POST",
            &format!("/api/v1/sessions/{single}/ports"),
            k,
            &serde_json::json!({"port": 8000}),
        )
        .await;
    assert_eq!(r.status, 501, "{r:?}");
    assert!(r.problem().detail.contains("single-use sandbox"), "{r:?}");

    // A session with no container yet cannot be tunnelled into (409), though its port may be
    // exposed ahead of time.
    let fresh = session_id("fresh");
    let open = serde_json::json!({"session_id": fresh, "tier": "session"});
    assert_eq!(
        gw.json("POST", "/api/v1/sessions", k, &open).await.status,
        201
    );
    expose(&gw, &acme, &fresh, serde_json::json!({"port": 8000})).await;
    let r = gw
        .send(
            "GET",
            &format!("/api/v1/sessions/{fresh}/ports/8000/"),
            k,
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, 409, "{r:?}");

    gw.stop().await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ports_socket_cannot_be_replaced_from_inside() {
    // The attack is code a person approved: the sandbox, not the assessor, must hold.
    let mesh = Mesh::builder()
        .tenants(&["acme"], &[])
        .real_risk()
        .confirm_standin(true)
        .real_workspace()
        .docker_executors(1)
        .scheduler(|_| {})
        .start()
        .await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let acme = gw.key("acme");
    let id = session_id("attack");
    serve_in_session(&gw, &acme, &id, &[("hello.txt", "hi\n")], &HTTP_SERVER).await;
    expose(&gw, &acme, &id, serde_json::json!({"port": 8000})).await;

    // From inside the session: every way to take the socket's place, each tried on /tmp first
    // (the positive control: the same calls work where the sandbox may write).
    let attack = r#"
import os, socket
def attempts(d, control):
    out = []
    s = os.path.join(d, "ports.sock")
    for name, f in [
        ("unlink", lambda: os.unlink(s)),
        ("rename", lambda: os.rename(s, os.path.join(d, "old.sock"))),
        ("bind", lambda: socket.socket(socket.AF_UNIX).bind(os.path.join(d, "evil.sock"))),
        ("create", lambda: open(os.path.join(d, "x"), "w").close()),
        ("chmod", lambda: os.chmod(d, 0o777)),
    ]:
        # The control's socket is put back before each try, as the door's always is there.
        if control and not os.path.exists(s):
            socket.socket(socket.AF_UNIX).bind(s)
        try:
            f()
            out.append(name + ":ok")
        except OSError as e:
            out.append(name + ":" + type(e).__name__)
    return out
os.makedirs("/tmp/ctl", exist_ok=True)
print("control", *attempts("/tmp/ctl", True))
print("door", *attempts("/run/sandmesh-ports", False))
print("mount", [l.split()[3].split(",")[0] for l in open("/proc/mounts") if " /run/sandmesh-ports " in l])
"#;
    let code = serde_json::json!({"language": "python", "code": attack});
    let r = gw
        .json(
            "POST",
            &format!("/api/v1/sessions/{id}/execute"),
            Some(&acme),
            &code,
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let result: messages::exec::ExecResult = r.json();
    let lines: Vec<&str> = result.stdout.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("control unlink:ok rename:ok bind:ok create:ok chmod:ok"),
        "{result:?}"
    );
    let door = lines.get(1).copied().unwrap_or_default();
    assert!(door.starts_with("door "), "{result:?}");
    assert!(
        !door.contains(":ok"),
        "the sandbox changed the ports directory: {door}"
    );
    assert_eq!(lines.get(2).copied(), Some("mount ['ro']"), "{result:?}");

    // The door still leads to the server (a background process, it outlived the run).
    let root = format!("/api/v1/sessions/{id}/ports/8000/hello.txt");
    test_support::eventually(
        "the server through the door after the attack",
        BOUND,
        || async {
            let r = gw.send("GET", &root, Some(&acme), &[], "").await;
            (r.status == 200 && &r.body[..] == b"hi\n").then_some(())
        },
    )
    .await;

    gw.stop().await;
    mesh.shutdown().await;
}

/// The data a tunnel's node sent until it ended the tunnel, and how (`eof`, or a close's
/// reason).
async fn read_down(down: &mut async_nats::Subscriber) -> (Vec<u8>, String) {
    let mut data = Vec::new();
    loop {
        let msg = tokio::time::timeout(BOUND, down.next())
            .await
            .expect("the tunnel ends within the bound")
            .expect("subscribed");
        let header = |name| {
            msg.headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.to_string())
                .unwrap_or_default()
        };
        match header(messages::ports::TUNNEL_KIND_HEADER).as_str() {
            "data" => data.extend_from_slice(&msg.payload),
            "eof" => return (data, "eof".into()),
            "close" => return (data, String::from_utf8_lossy(&msg.payload).into_owned()),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_frames_close_a_tunnel_and_another_tenant_cannot_enter_it() {
    use messages::ports::{TunnelConnect, TunnelOpened};
    let mesh: Mesh = start_mesh().await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let acme_key = gw.key("acme");
    let id = session_id("raw");
    serve_in_session(&gw, &acme_key, &id, &[("a", "b")], &HTTP_SERVER).await;
    expose(&gw, &acme_key, &id, serde_json::json!({"port": 8000})).await;

    let s = messages::Subjects::default();
    let acme = test_support::connect(&mesh.nats.agent_url("acme")).await;
    let other = test_support::connect(&mesh.nats.agent_url("default")).await;
    let acme_mesh = sandmesh_client::MeshClient::new(acme.clone(), s.clone());

    // A tunnel opened by hand, as any NATS client of the tenant may.
    let tunnel_id = messages::new_id();
    let mut down = acme_mesh
        .subscribe_live(s.tunnel_down_any(&tunnel_id))
        .await
        .unwrap();
    let connect = TunnelConnect {
        session_id: id.clone(),
        port: 8000,
        tunnel_id: tunnel_id.clone(),
        token: None,
    };
    let opened: TunnelOpened = test_support::eventually("the tunnel to open", BOUND, || async {
        acme_mesh
            .request(s.ports(messages::subjects::PortsOp::Connect), &connect)
            .await
            .ok()
    })
    .await;

    // Another tenant publishing into it: its import names only its own tunnels, so nothing
    // arrives (the positive control below shows the same frame from acme does).
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(messages::ports::TUNNEL_KIND_HEADER, "data");
    headers.insert(messages::ports::TUNNEL_SEQ_HEADER, "0");
    let request = Bytes::from_static(b"GET /a HTTP/1.0\r\n\r\n");
    let _ = other
        .publish_with_headers(opened.up.clone(), headers.clone(), request.clone())
        .await;
    other.flush().await.unwrap();
    // The tenant itself: the request goes through and the file comes back (had the other
    // tenant's frame arrived, this one would be out of sequence and the tunnel closed).
    acme.publish_with_headers(opened.up.clone(), headers, request)
        .await
        .unwrap();
    let (answer, end) = read_down(&mut down).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.0 200") && answer.ends_with("\r\n\r\nb"),
        "{answer:?} {end}"
    );

    // Hostile frames: one larger than a chunk, and one out of sequence. Each closes its
    // tunnel, saying why.
    for (size, seq, why) in [
        (messages::ports::TUNNEL_CHUNK + 1, "0", "the limit is"),
        (16, "5", "a message was lost"),
    ] {
        let tunnel_id = messages::new_id();
        let mut down = acme_mesh
            .subscribe_live(s.tunnel_down_any(&tunnel_id))
            .await
            .unwrap();
        let connect = TunnelConnect {
            tunnel_id: tunnel_id.clone(),
            ..connect.clone()
        };
        let opened: TunnelOpened = acme_mesh
            .request(s.ports(messages::subjects::PortsOp::Connect), &connect)
            .await
            .unwrap();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(messages::ports::TUNNEL_KIND_HEADER, "data");
        headers.insert(messages::ports::TUNNEL_SEQ_HEADER, seq);
        let payload = Bytes::from(vec![b'x'; size]);
        acme.publish_with_headers(opened.up.clone(), headers, payload)
            .await
            .unwrap();
        let (_, end) = read_down(&mut down).await;
        assert!(end.contains(why), "{end}");
    }

    // Unknown sessions, bad ids: refused at once.
    for (session, tunnel) in [
        ("no-such", messages::new_id()),
        (id.as_str(), "short".into()),
    ] {
        let bad = TunnelConnect {
            session_id: session.to_string(),
            port: 8000,
            tunnel_id: tunnel,
            token: None,
        };
        let e = acme_mesh
            .request::<_, TunnelOpened>(s.ports(messages::subjects::PortsOp::Connect), &bad)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e.kind(),
                sandmesh_client::ErrorKind::NotFound | sandmesh_client::ErrorKind::BadRequest
            ),
            "{e}"
        );
    }

    gw.stop().await;
    mesh.shutdown().await;
}
