//! Shared helpers: a real nats-server, workspace-store instances (in-process or as a child
//! process), clients, raw calls, tar builders for hostile archives.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream;
use kit::CancellationToken;
use messages::{Encoding, ErrorBody, Subjects};
use sandmesh_client::{MeshClient, WorkspaceClient};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tar::{EntryType, Header};
use workspace_store::WorkspaceConfig;

pub const TIMEOUT: Duration = Duration::from_secs(30);

/// One in-process instance; cancelled (gracefully stopped) on drop.
pub struct Instance {
    pub token: CancellationToken,
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

pub fn config(url: &str, instance: &str) -> WorkspaceConfig {
    let mut c = WorkspaceConfig::for_url(url);
    c.kit.instance_id = instance.to_string();
    c.kit.heartbeat_interval = Duration::from_millis(500);
    c.kit.shutdown_grace = Duration::from_secs(5);
    c
}

pub async fn start(config: WorkspaceConfig) -> Instance {
    let url = config.kit.nats_url.clone();
    let token = CancellationToken::new();
    tokio::spawn(workspace_store::run(config, token.clone()));
    let client = client(&url).await;
    wait_ready(&client).await;
    Instance { token }
}

/// Polls until a workspace call is answered (bounded).
pub async fn wait_ready(client: &WorkspaceClient) {
    test_support::eventually_true("workspace-store to answer", TIMEOUT, || async {
        client.usage("ready-probe").await.is_ok()
    })
    .await;
}

pub async fn nats(url: &str) -> async_nats::Client {
    let (options, plain) = test_support::connect_options(url);
    options
        .retry_on_initial_connect()
        .connect(plain)
        .await
        .expect("connect to nats")
}

pub async fn client(url: &str) -> WorkspaceClient {
    MeshClient::new(nats(url).await, Subjects::default())
        .with_timeout(TIMEOUT)
        .workspace()
}

/// A JSON request as any client (`nats req`) would send it; the raw outcome.
pub async fn raw<Req: Serialize, Resp: DeserializeOwned>(
    nc: &async_nats::Client,
    subject: String,
    req: &Req,
) -> Result<Resp, ErrorBody> {
    MeshClient::new(nc.clone(), Subjects::default())
        .with_timeout(TIMEOUT)
        .with_encoding(Encoding::Json)
        .request(subject, req)
        .await
        .map_err(|e| e.into_body())
}

/// Everything a test can observe of the store: every object name and, per session, its
/// recursive listing (path → size, sha256).
pub async fn store_state(
    url: &str,
    sessions: &[&str],
) -> (
    Vec<String>,
    BTreeMap<String, Vec<(String, u64, Option<String>)>>,
) {
    let js = jetstream::new(nats(url).await);
    let subjects = Subjects::default();
    let blobs = workspace_store::blobs::Blobs::open(&js, &subjects.workspace_objects_bucket(), 1)
        .await
        .unwrap();
    let mut names = blobs.names().await.unwrap();
    names.sort();
    let c = client(url).await;
    let mut listings = BTreeMap::new();
    for s in sessions {
        let entries = match c.list(s, None, true).await {
            Ok(l) => l.entries,
            Err(_) => Vec::new(),
        };
        listings.insert(
            s.to_string(),
            entries
                .into_iter()
                .map(|e| (e.path, e.size, e.sha256))
                .collect(),
        );
    }
    (names, listings)
}

/// Puts `data` in the workspace objects bucket as a client would hand it over.
pub async fn upload(url: &str, data: &[u8]) -> String {
    let js = jetstream::new(nats(url).await);
    let store = js
        .get_object_store(Subjects::default().workspace_objects_bucket())
        .await
        .unwrap();
    let name = format!("upload/{}", messages::new_id());
    store.put(name.as_str(), &mut &data[..]).await.unwrap();
    name
}

/// Deterministic pseudo-random bytes (xorshift), so no test depends on a RNG crate.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A tar built entry by entry with raw headers, so names and types the tar crate would
/// refuse to write (`../x`, `/abs`, links, devices) can be made.
pub struct RawTar {
    builder: tar::Builder<Vec<u8>>,
}

impl Default for RawTar {
    fn default() -> Self {
        Self {
            builder: tar::Builder::new(Vec::new()),
        }
    }
}

impl RawTar {
    pub fn entry(mut self, name: &[u8], kind: EntryType, mode: u32, data: &[u8]) -> Self {
        self.entry_with(name, kind, mode, data, None, None);
        self
    }

    pub fn file(self, name: &str, data: &[u8]) -> Self {
        self.entry(name.as_bytes(), EntryType::Regular, 0o644, data)
    }

    pub fn link(mut self, name: &str, kind: EntryType, target: &str) -> Self {
        self.entry_with(
            name.as_bytes(),
            kind,
            0o777,
            b"",
            Some(target.as_bytes()),
            None,
        );
        self
    }

    /// A header that declares `size` bytes but carries none (a size bomb).
    pub fn declared(mut self, name: &str, size: u64) -> Self {
        self.entry_with(
            name.as_bytes(),
            EntryType::Regular,
            0o644,
            b"",
            None,
            Some(size),
        );
        self
    }

    fn entry_with(
        &mut self,
        name: &[u8],
        kind: EntryType,
        mode: u32,
        data: &[u8],
        link: Option<&[u8]>,
        declared: Option<u64>,
    ) {
        let mut h = Header::new_gnu();
        {
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name);
            if let Some(link) = link {
                gnu.linkname[..link.len()].copy_from_slice(link);
            }
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_mtime(1_700_000_000);
        h.set_size(declared.unwrap_or(data.len() as u64));
        h.set_cksum();
        if declared.is_some() {
            // Header only: the data the header promises never follows.
            self.builder.get_mut().extend_from_slice(h.as_bytes());
        } else {
            self.builder.append(&h, data).unwrap();
        }
    }

    pub fn finish(self) -> Vec<u8> {
        self.builder.into_inner().unwrap()
    }
}
