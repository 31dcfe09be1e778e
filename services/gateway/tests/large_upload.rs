//! 300 MB through the gateway and back: the upload streams to the store by chunks, so the
//! process (gateway, store and this client, all in it) grows by a bounded amount, far below
//! the file's size. Alone in its test binary, so nothing else moves the resident size.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{start_store_mesh, Gateway, BOUND};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use messages::workspace::WsEntry;
use sha2::{Digest, Sha256};

const SIZE: u64 = 300 * 1000 * 1000 + 12_345;
const PIECE: u64 = 1 << 20;
/// What the whole process may grow by while 300 MB pass through it.
const GROWTH_BOUND: u64 = 64 << 20;

/// The file's bytes `start..end`: not text, not compressible, computed, never held whole.
fn bytes(start: u64, end: u64) -> Bytes {
    (start..end)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into()
}

fn pieces() -> impl futures::Stream<Item = Bytes> + Send + 'static {
    futures::stream::iter((0..SIZE).step_by(PIECE as usize))
        .map(|start| bytes(start, (start + PIECE).min(SIZE)))
}

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_megabytes_stream_through_in_bounded_memory() {
    let (mesh, store) = start_store_mesh(1024).await;
    let gw = Gateway::start(&mesh, |_| {}).await;
    let key = gw.key("default");
    let k = Some(key.as_str());
    let path = "/api/v1/sessions/large1/files/data/large.bin";
    let mut digest = Sha256::new();
    let mut pieces_again = std::pin::pin!(pieces());
    while let Some(piece) = pieces_again.next().await {
        digest.update(&piece);
    }
    let expected = hex::encode(digest.finalize());

    // Warm up the paths (connections, buffers, the store's streams) before the baseline.
    let r = gw
        .send(
            "PUT",
            "/api/v1/sessions/large1/files/warm.bin",
            k,
            &[],
            bytes(0, 4 << 20),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let baseline = resident_bytes();
    let peak = Arc::new(AtomicU64::new(baseline));
    let sampler = tokio::spawn({
        let peak = peak.clone();
        async move {
            loop {
                peak.fetch_max(resident_bytes(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    let length = SIZE.to_string();
    let r = gw
        .send_stream("PUT", path, k, &[("content-length", &length)], pieces())
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let entry: WsEntry = r.json();
    assert_eq!(entry.size, SIZE);
    assert_eq!(entry.sha256.as_deref(), Some(expected.as_str()));

    // A range across a chunk boundary near the end, then the whole file streamed and hashed.
    let (a, b) = (SIZE - 5_000_000, SIZE - 1_234_567);
    let r = gw
        .send("GET", path, k, &[("range", &format!("bytes={a}-{b}"))], "")
        .await;
    assert_eq!(r.status, 206, "{:?}", r.headers);
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes {a}-{b}/{SIZE}").as_str())
    );
    assert!(r.body == bytes(a, b + 1), "the range differs");
    let response = gw.open("GET", path, k, &[], "").await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut digest = Sha256::new();
    let mut read = 0u64;
    while let Some(frame) = tokio::time::timeout(BOUND, body.frame()).await.unwrap() {
        if let Ok(data) = frame.unwrap().into_data() {
            read += data.len() as u64;
            digest.update(&data);
        }
    }
    assert_eq!((read, hex::encode(digest.finalize())), (SIZE, expected));

    sampler.abort();
    let growth = peak.load(Ordering::Relaxed).saturating_sub(baseline);
    eprintln!(
        "300 MB up and down: resident {} MiB before, peak {} MiB above it",
        baseline >> 20,
        growth >> 20
    );
    assert!(
        growth < GROWTH_BOUND,
        "the process grew by {} MiB for a {} MB file",
        growth >> 20,
        SIZE / 1_000_000
    );

    gw.stop().await;
    store.stop().await;
    mesh.shutdown().await;
}
