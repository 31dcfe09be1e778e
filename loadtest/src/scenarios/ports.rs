//! `ports`: what a preview port costs. One server program (`SERVER`: `/small` answers 2 bytes,
//! `/big` streams `--big-bytes`) runs twice in the same run: on the host's loopback, where the
//! loadtest asks it directly (a new connection per request, the floor), and in a session's
//! container, where it is reached through the gateway's proxy (`GET
//! /api/v1/sessions/{id}/ports/{port}/…` with a key, a kept-alive connection to the gateway, a
//! new tunnel per request). Series: `ports/{direct,gateway}/small` (request latency, c=1) and
//! `ports/{direct,gateway}/big` (whole-body time; the note gives MB/s). Then `proc/first-output`:
//! `proc.start` of `echo x` in a session to its first output byte (read with `proc.output`, a
//! `proc.wait` between two empty reads), one at a time.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;

use crate::driver::{drive, note, Load, Sample};
use crate::scenarios::Ctx;

/// The server, the same program on both sides (Python's standard library only).
const SERVER: &str = r#"
import socket, sys, threading
port, big = int(sys.argv[1]), int(sys.argv[2])
chunk = b"x" * 65536
def serve(c):
    f = c.makefile("rb")
    while True:
        line = f.readline()
        if not line:
            return
        path = line.split()[1]
        while f.readline() not in (b"\r\n", b""):
            pass
        if path == b"/small":
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            continue
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % big)
        left = big
        while left > 0:
            n = min(left, len(chunk))
            c.sendall(chunk[:n])
            left -= n
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// The port the server listens on in the session's container.
const SANDBOX_PORT: u16 = 8000;

struct HostServer(Child);

impl Drop for HostServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn connect(addr: SocketAddr) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// `GET path`, timed to the whole body, which must be `expect_len` bytes.
async fn get(
    sender: &mut SendRequest<Empty<Bytes>>,
    host: &str,
    path: &str,
    key: Option<&str>,
    expect_len: u64,
) -> Sample {
    let start = Instant::now();
    let mut request = hyper::Request::get(path).header("host", host);
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let request = request.body(Empty::new()).expect("a valid request");
    let answered = async {
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body.len() as u64))
    }
    .await;
    match answered {
        Ok((status, len)) if status.is_success() && len == expect_len => {
            Sample::timed(start.elapsed(), "ok")
        }
        Ok((status, len)) => Sample::failed(
            format!("err:http{}", status.as_u16()),
            format!("{len} bytes"),
        ),
        Err(e) => Sample::failed("err:http", format!("{e:#}")),
    }
}

/// A request of its own connection (the direct floor), or of a kept-alive one (the gateway).
async fn measure(
    ctx: &mut Ctx,
    name: &str,
    target: SocketAddr,
    path: &str,
    key: Option<String>,
    expect_len: u64,
    load: Load,
) -> anyhow::Result<crate::report::SeriesReport> {
    let host = target.to_string();
    let path = path.to_string();
    let run = drive(name, load.with_concurrency(1), move |_, _| {
        let (host, path, key) = (host.clone(), path.clone(), key.clone());
        async move {
            let Ok(mut sender) = connect(target).await else {
                return Sample::failed("err:connect", target.to_string());
            };
            get(&mut sender, &host, &path, key.as_deref(), expect_len).await
        }
    })
    .await;
    let report = run.report(name);
    ctx.push(report.clone());
    Ok(report)
}

pub async fn ports(
    ctx: &mut Ctx,
    gateway: SocketAddr,
    key: &str,
    big_bytes: u64,
    load: Load,
) -> anyhow::Result<()> {
    // The direct floor: the server on the host's loopback.
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("server.py");
    std::fs::write(&script, SERVER)?;
    let host_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let _host = HostServer(
        Command::new("python3")
            .arg(&script)
            .args([host_port.to_string(), big_bytes.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .context("python3 on the host")?,
    );
    let direct: SocketAddr = format!("127.0.0.1:{host_port}").parse()?;

    // The same server in a session's container, a background process (`proc.start`), reached
    // through the gateway.
    let session = format!("lt-ports-{}", messages::new_id().to_ascii_lowercase());
    let mut gw = connect(gateway).await?;
    let http = |method: &str, path: String, body: String| {
        hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", gateway.to_string())
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from(body)))
            .expect("a valid request")
    };
    // A connection of its own per setup request: the gateway may close one after an upload.
    let api = || async {
        let stream = tokio::net::TcpStream::connect(gateway).await?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        anyhow::Ok(sender)
    };
    let open = serde_json::json!({"session_id": session, "tier": "session"}).to_string();
    let expose = serde_json::json!({"port": SANDBOX_PORT}).to_string();
    // The program goes in as a file of the workspace: written by code, a script full of
    // sockets would wait for a person's approval.
    for (method, path, body) in [
        ("POST", "/api/v1/sessions".to_string(), open),
        (
            "PUT",
            format!("/api/v1/sessions/{session}/files/server.py"),
            SERVER.to_string(),
        ),
        ("POST", format!("/api/v1/sessions/{session}/ports"), expose),
    ] {
        let response = api()
            .await?
            .send_request(http(method, path.clone(), body))
            .await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::ensure!(
            status.is_success(),
            "{method} {path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    let start = serde_json::json!({
        "argv": ["python3", "server.py", SANDBOX_PORT.to_string(), big_bytes.to_string()],
        "tag": "loadtest-server",
    })
    .to_string();
    let path = format!("/api/v1/sessions/{session}/processes");
    let response = api()
        .await?
        .send_request(http("POST", path.clone(), start))
        .await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    anyhow::ensure!(
        status.is_success(),
        "POST {path}: {status} {}",
        String::from_utf8_lossy(&body)
    );
    let root = format!("/api/v1/sessions/{session}/ports/{SANDBOX_PORT}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = get(
            &mut gw,
            &gateway.to_string(),
            &format!("{root}/small"),
            Some(key),
            2,
        )
        .await;
        if up.status == "ok" {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the server in the session never answered: {up:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let key = Some(key.to_string());
    let small_direct = measure(ctx, "ports/direct/small", direct, "/small", None, 2, load).await?;
    let small_gw = measure(
        ctx,
        "ports/gateway/small",
        gateway,
        &format!("{root}/small"),
        key.clone(),
        2,
        load,
    )
    .await?;
    let bulk = Load {
        requests: Some(load.requests.unwrap_or(10).min(10)),
        ..load
    };
    let big_direct = measure(
        ctx,
        "ports/direct/big",
        direct,
        "/big",
        None,
        big_bytes,
        bulk,
    )
    .await?;
    let big_gw = measure(
        ctx,
        "ports/gateway/big",
        gateway,
        &format!("{root}/big"),
        key,
        big_bytes,
        bulk,
    )
    .await?;
    let mbps = |ms: f64| big_bytes as f64 / 1e6 / (ms / 1e3);
    note(&format!(
        "ports small request p50: direct {:.2} ms, through the gateway {:.2} ms (+{:.2} ms); p99 direct {:.2}, gateway {:.2}",
        small_direct.latency.p50_ms,
        small_gw.latency.p50_ms,
        small_gw.latency.p50_ms - small_direct.latency.p50_ms,
        small_direct.latency.p99_ms,
        small_gw.latency.p99_ms,
    ));
    first_output(ctx, load).await?;
    note(&format!(
        "ports {} MB download p50: direct {:.0} MB/s, through the gateway {:.0} MB/s (ratio {:.2})",
        big_bytes / 1_000_000,
        mbps(big_direct.latency.p50_ms),
        mbps(big_gw.latency.p50_ms),
        big_direct.latency.p50_ms / big_gw.latency.p50_ms,
    ));
    Ok(())
}

/// `proc.start` to the first output byte, over NATS as the loadtest's own user.
async fn first_output(ctx: &mut Ctx, load: Load) -> anyhow::Result<()> {
    use messages::proc::{ProcCommand, ProcOutputRequest, ProcStart};
    let session = format!("lt-proc-{}", messages::new_id().to_ascii_lowercase());
    let open = messages::session::SessionOpen {
        session_id: Some(session.clone()),
        tier: Some(messages::exec::Tier::Session),
        ..Default::default()
    };
    ctx.mesh.api.sessions().open(&open).await?;
    let procs = ctx.mesh.api.procs();
    let name = "proc/first-output";
    let run = drive(name, load.with_concurrency(1), move |_, _| {
        let (procs, session) = (procs.clone(), session.clone());
        async move {
            let start = Instant::now();
            let req = ProcStart {
                session_id: session.clone(),
                command: ProcCommand::Argv(vec!["echo".into(), "x".into()]),
                cwd: None,
                env: Default::default(),
                stdin: false,
                pty: None,
                tag: None,
                timeout_ms: 0,
                requested_by: Some("loadtest".into()),
            };
            let started = match procs.start(&req, None).await {
                Ok(s) => s,
                Err(e) => return Sample::failed("err:start", e.to_string()),
            };
            let output = ProcOutputRequest {
                session_id: session.clone(),
                proc_id: started.proc_id.clone(),
                from_seq: 0,
                max_bytes: None,
            };
            for _ in 0..50 {
                match procs.output(&output).await {
                    Ok(o) if !o.chunks.is_empty() => return Sample::timed(start.elapsed(), "ok"),
                    Ok(_) => {
                        let _ = procs
                            .wait(&session, &started.proc_id, Duration::from_millis(200))
                            .await;
                    }
                    Err(e) => return Sample::failed("err:output", e.to_string()),
                }
            }
            Sample::failed("err:no-output", started.proc_id)
        }
    })
    .await;
    let report = run.report(name);
    note(&format!(
        "proc.start to first output byte: p50 {:.2} ms, p99 {:.2} ms",
        report.latency.p50_ms, report.latency.p99_ms
    ));
    ctx.push(report);
    Ok(())
}
