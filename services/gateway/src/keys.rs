//! API keys: who a Bearer token is. A key belongs to one tenant; the gateway acts for it as that
//! tenant's agent.
//!
//! The keys live in a file (`gateway-keys.json`, mode 0600, beside `tenancy.json`), not in a KV
//! bucket: `sandmesh tenant key create` then works like `sandmesh tenant add` — on the data
//! directory, with or without a running mesh — and no NATS user needs rights to a bucket of
//! secrets. Only a SHA-256 of each key is stored, so the file alone lets nobody in; a key is
//! shown once, when it is made.
//!
//! [`KeyStore`] re-reads the file whenever it changed (a `stat` per look-up), so a revocation
//! takes effect at the next request without restarting the gateway.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use messages::tenancy::Tenant;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The key file's name in the data directory.
pub const KEYS_FILE: &str = "gateway-keys.json";

/// Every key starts so: a leaked key is recognisable (secret scanners, logs).
const KEY_PREFIX: &str = "smk_";

/// The same key spelled as E2B's SDKs expect theirs (`e2b_<hex>`: older SDKs refuse any other
/// form): the id and the secret run together. One key, two spellings, one digest.
const E2B_PREFIX: &str = "e2b_";

/// A sandbox's envd access token starts so (the E2B facade's `X-Access-Token`).
const SANDBOX_TOKEN_PREFIX: &str = "sbt_";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a sandmesh key file")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Write(#[from] sandmesh_auth::TenancyError),
    #[error("no key {0:?}")]
    Unknown(String),
}

/// One key as stored: never the key itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The public part of the key (`smk_<id>_…`), for `list` and `revoke`.
    pub id: String,
    pub tenant: Tenant,
    /// Hex SHA-256 of the whole key.
    pub sha256: String,
    /// Unix milliseconds.
    pub created_at: u64,
    /// Unix milliseconds; a revoked key is kept so `list` shows it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct KeyFile {
    #[serde(default)]
    keys: Vec<KeyRecord>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn digest(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The id part of a well-formed key.
fn key_id(key: &str) -> Option<&str> {
    let (id, secret) = key.strip_prefix(KEY_PREFIX)?.split_once('_')?;
    (id.len() == 16 && secret.len() == 64).then_some(id)
}

/// A key as sandmesh spells it, from either spelling (`smk_…` unchanged, `e2b_<id><secret>`
/// rewritten); `None` for anything else.
pub fn canonical(presented: &str) -> Option<String> {
    if key_id(presented).is_some() {
        return Some(presented.to_string());
    }
    let hex = presented.strip_prefix(E2B_PREFIX)?;
    let well_formed = hex.len() == 80 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    well_formed.then(|| format!("{KEY_PREFIX}{}_{}", &hex[..16], &hex[16..]))
}

/// The E2B spelling of a sandmesh key (`sandmesh tenant key create --e2b`).
pub fn e2b_spelling(key: &str) -> Option<String> {
    key_id(key)?;
    let (id, secret) = key.strip_prefix(KEY_PREFIX)?.split_once('_')?;
    Some(format!("{E2B_PREFIX}{id}{secret}"))
}

/// The MAC key and message of a sandbox token: it authenticates one sandbox of one tenant.
/// The key's digest is the MAC key, so only the gateway (the key file, mode 0600) and the key's
/// holder can make one, and revoking the key revokes its sandboxes' tokens.
fn sandbox_token_input(record: &KeyRecord, sandbox: &str) -> Option<(ring::hmac::Key, String)> {
    let secret = hex::decode(&record.sha256).ok()?;
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret);
    Some((key, format!("e2b-sandbox\0{}\0{sandbox}", record.tenant)))
}

fn read(path: &Path) -> Result<KeyFile, KeyError> {
    let shown = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|source| KeyError::Parse {
            path: shown,
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(KeyFile::default()),
        Err(source) => Err(KeyError::Read {
            path: shown,
            source,
        }),
    }
}

fn write(path: &Path, file: &KeyFile) -> Result<(), KeyError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| KeyError::Read {
            path: dir.display().to_string(),
            source,
        })?;
    }
    let text = serde_json::to_string_pretty(file).expect("keys serialise");
    Ok(sandmesh_auth::write_private(path, &text)?)
}

/// Makes a key for `tenant`, stores its digest and returns the key (the only time it exists
/// outside the caller's hands) with its record.
pub fn create(path: &Path, tenant: &Tenant) -> Result<(String, KeyRecord), KeyError> {
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id).expect("the OS random number generator");
    getrandom::fill(&mut secret).expect("the OS random number generator");
    let id = hex::encode(id);
    let key = format!("{KEY_PREFIX}{id}_{}", hex::encode(secret));
    let record = KeyRecord {
        id,
        tenant: tenant.clone(),
        sha256: digest(&key),
        created_at: now_ms(),
        revoked_at: None,
    };
    let mut file = read(path)?;
    file.keys.push(record.clone());
    write(path, &file)?;
    Ok((key, record))
}

/// Every key, revoked ones too, oldest first.
pub fn list(path: &Path) -> Result<Vec<KeyRecord>, KeyError> {
    Ok(read(path)?.keys)
}

/// Revokes a key by its id (again: nothing changes).
pub fn revoke(path: &Path, id: &str) -> Result<KeyRecord, KeyError> {
    let mut file = read(path)?;
    let record = file
        .keys
        .iter_mut()
        .find(|k| k.id == id)
        .ok_or_else(|| KeyError::Unknown(id.to_string()))?;
    record.revoked_at.get_or_insert_with(now_ms);
    let revoked = record.clone();
    write(path, &file)?;
    Ok(revoked)
}

/// Who a presented key is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub key_id: String,
    pub tenant: Tenant,
}

/// What the file looked like when it was last read, to notice a change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        // `write_private` renames a new file over the old one: a new inode even when the
        // size and the (coarse) mtime happen to match.
        inode: meta.ino(),
    })
}

/// The gateway's view of the key file, re-read when the file changes.
pub struct KeyStore {
    path: PathBuf,
    /// The stamp of the file the keys were read from, and the live keys by id.
    loaded: Mutex<(Option<Stamp>, BTreeMap<String, KeyRecord>)>,
}

impl KeyStore {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            loaded: Mutex::new((None, BTreeMap::new())),
        }
    }

    /// The caller a key belongs to; `None` for anything but a live key.
    pub fn verify(&self, key: &str) -> Option<Caller> {
        let record = self.live(key_id(key)?)?;
        same_secret(&record.sha256, &digest(key)).then(|| Caller::of(&record))
    }

    /// The token that lets `caller` reach `sandbox` without its key (E2B's `envdAccessToken`:
    /// the SDKs send it, and no key, to the sandbox's own routes). `None` once the key is
    /// revoked.
    pub fn sandbox_token(&self, caller: &Caller, sandbox: &str) -> Option<String> {
        let record = self.live(&caller.key_id)?;
        let (key, message) = sandbox_token_input(&record, sandbox)?;
        let tag = ring::hmac::sign(&key, message.as_bytes());
        Some(format!(
            "{SANDBOX_TOKEN_PREFIX}{}_{}",
            record.id,
            hex::encode(tag.as_ref())
        ))
    }

    /// The caller a sandbox token was made for, when it was made for `sandbox` by a live key.
    pub fn verify_sandbox_token(&self, token: &str, sandbox: &str) -> Option<Caller> {
        let (id, mac) = token.strip_prefix(SANDBOX_TOKEN_PREFIX)?.split_once('_')?;
        let mac = hex::decode(mac).ok()?;
        let record = self.live(id)?;
        let (key, message) = sandbox_token_input(&record, sandbox)?;
        // `verify` compares in constant time.
        ring::hmac::verify(&key, message.as_bytes(), &mac).ok()?;
        Some(Caller::of(&record))
    }

    /// The live (not revoked) key of this id, from the file as it is now.
    fn live(&self, id: &str) -> Option<KeyRecord> {
        let mut loaded = self.loaded.lock().expect("keys lock");
        let now = stamp(&self.path);
        if now != loaded.0 {
            match read(&self.path) {
                Ok(file) => {
                    let live = file
                        .keys
                        .into_iter()
                        .filter(|k| k.revoked_at.is_none())
                        .map(|k| (k.id.clone(), k))
                        .collect();
                    *loaded = (now, live);
                }
                // Half-written by hand, say: no key is valid until it reads again, which is
                // the safe side for a revocation.
                Err(e) => {
                    tracing::warn!(error = %kit::error_chain(&e), "cannot read the API keys");
                    *loaded = (None, BTreeMap::new());
                }
            }
        }
        loaded.1.get(id).cloned()
    }
}

impl Caller {
    fn of(record: &KeyRecord) -> Self {
        Self {
            key_id: record.id.clone(),
            tenant: record.tenant.clone(),
        }
    }
}

/// Compares digests in time independent of where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_verifies_until_it_is_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEYS_FILE);
        let acme = Tenant::new("acme").unwrap();
        let (key, record) = create(&path, &acme).unwrap();
        assert_eq!(key.lines().count(), 1);
        let store = KeyStore::new(path.clone());
        let caller = store.verify(&key).expect("a live key");
        assert_eq!(caller.tenant, acme);
        assert_eq!(caller.key_id, record.id);
        // Stored hashed: the file does not hold the key.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&key[KEY_PREFIX.len() + 17..]));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        revoke(&path, &record.id).unwrap();
        assert_eq!(store.verify(&key), None, "revoked without a restart");
        assert!(list(&path).unwrap()[0].revoked_at.is_some());
        assert!(matches!(revoke(&path, "nope"), Err(KeyError::Unknown(_))));
    }

    #[test]
    fn a_key_spelled_for_e2b_is_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEYS_FILE);
        let (key, _) = create(&path, &Tenant::default_tenant()).unwrap();
        let e2b = e2b_spelling(&key).unwrap();
        assert!(e2b.starts_with("e2b_") && e2b[4..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(canonical(&e2b).as_deref(), Some(key.as_str()));
        assert_eq!(canonical(&key).as_deref(), Some(key.as_str()));
        for bad in ["e2b_", "e2b_xyz", &e2b[..e2b.len() - 1], &format!("{e2b}0")] {
            assert_eq!(canonical(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_sandbox_token_opens_one_sandbox_of_one_key_until_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEYS_FILE);
        let (key, record) = create(&path, &Tenant::default_tenant()).unwrap();
        let store = KeyStore::new(path.clone());
        let caller = store.verify(&key).unwrap();
        let token = store.sandbox_token(&caller, "s1").unwrap();
        assert_eq!(
            store.verify_sandbox_token(&token, "s1"),
            Some(caller.clone())
        );
        assert_eq!(
            store.verify_sandbox_token(&token, "s2"),
            None,
            "another sandbox"
        );
        let mut forged = token.clone();
        forged.pop();
        forged.push(if token.ends_with('0') { '1' } else { '0' });
        assert_eq!(store.verify_sandbox_token(&forged, "s1"), None);
        for bad in ["", "sbt_", "sbt_x_y", &key] {
            assert_eq!(store.verify_sandbox_token(bad, "s1"), None, "{bad:?}");
        }
        revoke(&path, &record.id).unwrap();
        assert_eq!(
            store.verify_sandbox_token(&token, "s1"),
            None,
            "revoked with its key"
        );
    }

    #[test]
    fn forged_and_malformed_keys_are_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEYS_FILE);
        let (key, _) = create(&path, &Tenant::default_tenant()).unwrap();
        let store = KeyStore::new(path);
        let mut forged = key.clone();
        forged.pop();
        forged.push(if key.ends_with('0') { '1' } else { '0' });
        assert_eq!(store.verify(&forged), None);
        for bad in ["", "smk_", "Bearer x", &key[..key.len() - 1]] {
            assert_eq!(store.verify(bad), None, "{bad:?}");
        }
    }
}
