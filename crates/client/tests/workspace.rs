//! `WorkspaceClient` against the real workspace-store: round trips, error kinds, and content
//! larger than one NATS message through the object-store hand-off, both ways.

use crate::common::Mesh;
use messages::workspace::{INLINE_MAX_BYTES, MEMORY_FILES};
use messages::ServiceName;
use sandmesh_client::ErrorKind;

async fn store() -> Mesh {
    Mesh::new()
        .await
        .workspace_store()
        .ready(ServiceName::WorkspaceStore)
        .await
}

/// Bytes no compression or text detection makes small: every byte value, in a long cycle.
fn noise(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7919 % 251) as u8).collect()
}

#[tokio::test]
async fn files_round_trip_and_list_stat_delete_see_them() {
    let mesh = store().await;
    let ws = mesh.client.workspace();
    ws.init("s1").await.unwrap();
    let entry = ws.write("s1", "code/a.py", b"print(1)\n").await.unwrap();
    assert_eq!((entry.path.as_str(), entry.size), ("code/a.py", 9));
    ws.write("s1", "data/b.bin", &[0, 159, 146, 150])
        .await
        .unwrap();

    assert_eq!(ws.read("s1", "code/a.py").await.unwrap(), b"print(1)\n");
    assert_eq!(
        ws.read("s1", "data/b.bin").await.unwrap(),
        [0, 159, 146, 150]
    );
    assert_eq!(ws.stat("s1", "data/b.bin").await.unwrap().size, 4);
    let listing = ws.list("s1", Some("code"), false).await.unwrap();
    let paths: Vec<&str> = listing.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["code/a.py"]);

    ws.delete("s1", "code/a.py", false).await.unwrap();
    assert!(!ws.exists("s1", "code/a.py").await.unwrap());
    // What is left: the layout's memory files and the 4 bytes of data/b.bin.
    let memory: usize = MEMORY_FILES.iter().map(|(_, text)| text.len()).sum();
    assert_eq!(ws.usage("s1").await.unwrap().bytes, (memory + 4) as u64);
}

#[tokio::test]
async fn refusals_keep_their_kind() {
    let mesh = store().await;
    let ws = mesh.client.workspace();
    ws.write("s1", "code/a.py", b"x").await.unwrap();

    let missing = ws.read("s1", "missing").await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);
    let escape = ws.read("s1", "../etc/passwd").await.unwrap_err();
    assert_eq!(escape.kind(), ErrorKind::BadRequest);
    // A directory is not a file, and a non-empty one is not removed without `recursive`.
    let over_dir = ws.write("s1", "code", b"x").await.unwrap_err();
    assert_eq!(over_dir.kind(), ErrorKind::Conflict);
    let non_empty = ws.delete("s1", "code", false).await.unwrap_err();
    assert_eq!(non_empty.kind(), ErrorKind::Conflict);
    let e = ws.read("s1", "missing").await.unwrap_err();
    assert!(
        e.service_error().is_some(),
        "a refusal carries the service's body: {e}"
    );
}

#[tokio::test]
async fn a_5_mb_file_goes_through_the_object_store_both_ways() {
    let mesh = store().await;
    let ws = mesh.client.workspace();
    let big = noise(5 << 20);
    assert!(
        big.len() as u64 > 4 * INLINE_MAX_BYTES,
        "far beyond one message"
    );
    let entry = ws.write("s1", "data/big.bin", &big).await.unwrap();
    assert_eq!(entry.size, big.len() as u64);
    assert!(ws.read("s1", "data/big.bin").await.unwrap() == big);

    // The same through a snapshot of the workspace and a restore into another one.
    let tar = ws.snapshot("s1", None).await.unwrap();
    assert!(tar.len() as u64 > INLINE_MAX_BYTES);
    let restored = ws.restore("s2", &tar, false, Vec::new()).await.unwrap();
    assert!(
        restored.files_created.iter().any(|p| p == "data/big.bin"),
        "{restored:?}"
    );
    assert!(ws.read("s2", "data/big.bin").await.unwrap() == big);
}

#[tokio::test]
async fn without_a_store_calls_are_unavailable() {
    let mesh = Mesh::new().await;
    let e = mesh.client.workspace().usage("s1").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}
