//! `http`: what the HTTP gateway adds (its target: ≤ 1 ms of mesh overhead p50 more than NATS). In
//! one run, at each concurrency: `print(1)` as a bare Docker exec (the `baseline`, for reference),
//! the same request through NATS (`exec`, as every other scenario sends it), and through the
//! gateway (`POST /api/v1/execute` with a Bearer key, one kept-alive HTTP/1.1 connection per
//! worker), series after series. The report's `http overhead` line is the gateway's p50 minus
//! NATS's.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use messages::exec::{ExecResult, Language, TierChoice};
use tokio::sync::Mutex;

use crate::client::{exec_sample, exec_sync};
use crate::driver::{drive, note, Load, Sample};
use crate::programs::{request, tiny};
use crate::scenarios::{exec, Ctx};

/// A key of tenant `default` for the gateway of a mesh the loadtest started (the key file is
/// in its data directory; the gateway reads new keys without a restart).
pub fn create_key(sandmesh: &Path, data_dir: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new(sandmesh)
        .args(["tenant", "key", "create", "default"])
        .env("SANDMESH_DATA_DIR", data_dir)
        .output()
        .with_context(|| format!("running {} tenant key create", sandmesh.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "sandmesh tenant key create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let key = stdout.lines().last().unwrap_or_default().trim().to_string();
    anyhow::ensure!(!key.is_empty(), "sandmesh tenant key create printed no key");
    Ok(key)
}

/// One kept-alive connection to the gateway.
async fn connect(addr: SocketAddr) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the gateway at {addr}"))?;
    stream.set_nodelay(true)?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// `POST /api/v1/execute`, timed from the request to the whole body.
async fn exec_http(
    sender: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    key: &str,
    body: Bytes,
    expect: &str,
) -> Sample {
    let start = Instant::now();
    let request = hyper::Request::post("/api/v1/execute")
        .header("host", addr.to_string())
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("a valid request");
    let answered = async {
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, bytes))
    }
    .await;
    let latency = start.elapsed();
    match answered {
        Ok((status, bytes)) if status.is_success() => {
            match serde_json::from_slice::<ExecResult>(&bytes) {
                Ok(result) => exec_sample(Ok(result), latency, Some(expect)),
                Err(e) => Sample::failed("err:decode", e.to_string()),
            }
        }
        Ok((status, bytes)) => Sample::failed(
            format!("err:http{}", status.as_u16()),
            String::from_utf8_lossy(&bytes)
                .chars()
                .take(200)
                .collect::<String>(),
        ),
        Err(e) => Sample::failed("err:http", format!("{e:#}")),
    }
}

pub async fn http(
    ctx: &mut Ctx,
    image: &str,
    gateway: SocketAddr,
    key: &str,
    concurrency: &[usize],
    load: Load,
) -> anyhow::Result<()> {
    let language = Language::Python;
    let (code, expect, _) = tiny(language);
    exec::baseline(ctx, image, &[language], concurrency, load).await?;
    let req = request(language, code, TierChoice::Ephemeral, None);
    // One unmeasured execution each way: connections, caches, the key's first check.
    exec_sync(&ctx.mesh, &req, None).await;
    let mut warm = connect(gateway).await?;
    let mut body = req.clone();
    body.execution_id = None;
    let body = Bytes::from(serde_json::to_vec(&body)?);
    let first = exec_http(&mut warm, gateway, key, body.clone(), expect).await;
    anyhow::ensure!(
        first.status == "ok",
        "the gateway at {gateway} does not run print(1): {} {}",
        first.status,
        first.detail.unwrap_or_default()
    );
    for &c in concurrency {
        let name = format!("http/nats/python/c{c}");
        let mesh = ctx.mesh.clone();
        let nats_req = req.clone();
        let run = drive(&name, load.with_concurrency(c), move |_, _| {
            let (mesh, req) = (mesh.clone(), nats_req.clone());
            async move { exec_sync(&mesh, &req, Some(expect)).await }
        })
        .await;
        let nats = run
            .report(&name)
            .tagged(Some("python"), Some("ephemeral"), Some("nats"));

        let mut senders = Vec::with_capacity(c);
        for _ in 0..c {
            senders.push(Mutex::new(connect(gateway).await?));
        }
        let senders = Arc::new(senders);
        let (key, body) = (Arc::<str>::from(key), body.clone());
        let name = format!("http/gateway/python/c{c}");
        let run = drive(&name, load.with_concurrency(c), move |worker, _| {
            let (senders, key, body) = (senders.clone(), key.clone(), body.clone());
            async move {
                let mut sender = senders[worker].lock().await;
                exec_http(&mut sender, gateway, &key, body, expect).await
            }
        })
        .await;
        let http = run
            .report(&name)
            .tagged(Some("python"), Some("ephemeral"), Some("http"));
        // End to end, the interpreter's start (tens of ms, noisy) dominates; the mesh overhead
        // (end to end minus the executor's own time) is where the gateway's cost shows.
        let ovh = |s: &crate::report::SeriesReport| s.overhead.as_ref().map(|o| o.p50_ms);
        note(&format!(
            "http overhead c{c}: p50 {:+.2} ms (gateway {:.2}, NATS {:.2}), p99 {:+.2} ms \
             (gateway {:.2}, NATS {:.2}); mesh overhead p50 {:+.2} ms (gateway {:.2}, NATS {:.2})",
            http.latency.p50_ms - nats.latency.p50_ms,
            http.latency.p50_ms,
            nats.latency.p50_ms,
            http.latency.p99_ms - nats.latency.p99_ms,
            http.latency.p99_ms,
            nats.latency.p99_ms,
            ovh(&http).unwrap_or(f64::NAN) - ovh(&nats).unwrap_or(f64::NAN),
            ovh(&http).unwrap_or(f64::NAN),
            ovh(&nats).unwrap_or(f64::NAN),
        ));
        ctx.push(nats);
        ctx.push(http);
    }
    Ok(())
}

/// The gateway to use (`--gateway`, or the spawned mesh's) and a key for it (`--key`, or one
/// made in the spawned mesh), once it accepts connections.
pub async fn gateway_and_key(
    ctx: &Ctx,
    gateway: Option<SocketAddr>,
    key: &Option<String>,
) -> anyhow::Result<(SocketAddr, String)> {
    let gateway = gateway
        .or(ctx.gateway)
        .context("no gateway: --gateway ADDR, or --spawn-mesh")?;
    let key = match key {
        Some(key) => key.clone(),
        None if ctx.gateway.is_some() => create_key(&ctx.sandmesh_bin, &ctx.work_dir.join("mesh"))?,
        None => anyhow::bail!("no API key: --key (SANDMESH_GATEWAY_KEY)"),
    };
    wait_for(gateway).await?;
    Ok((gateway, key))
}

/// How long the scenario waits for a gateway that is still starting.
pub const GATEWAY_WAIT: Duration = Duration::from_secs(60);

/// Waits until the gateway accepts connections.
pub async fn wait_for(gateway: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + GATEWAY_WAIT;
    loop {
        if tokio::net::TcpStream::connect(gateway).await.is_ok() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no gateway answers at {gateway} (SANDMESH_GATEWAY_ADDR of the mesh)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
