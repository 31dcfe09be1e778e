//! The seal of a test run's report: the code under test runs as the sandbox user and can write
//! anything the runner writes, so the report is trusted only with an HMAC-SHA256 tag made with
//! a key the code never reaches. Each run's key is derived from a secret of this scheduler
//! process and the run's (tenant-scoped) execution id: a replay of the id reads the same
//! report and verifies it again, and no two runs share a key. The key goes to the runner's
//! parent on its stdin — never in the code file, the environment or anything stored.

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// What follows the report's bytes in the file: this, the tag in lowercase hex, ` -->\n`.
pub const SEAL_PREFIX: &str = "<!-- sandmesh-report-hmac-sha256 ";
const SEAL_SUFFIX: &str = " -->\n";
const TAG_HEX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error(
        "the test report has no seal: it is not the one the runner wrote (replaced after the \
         run, or the runner was stopped before it wrote one)"
    )]
    Unsealed,
    #[error(
        "the test report's seal does not match: it was changed after the runner wrote it (or \
         this is a replay on a scheduler restarted since the run)"
    )]
    Mismatch,
}

/// Makes each run's key.
#[derive(Clone)]
pub struct Sealer {
    secret: hmac::Key,
}

impl Sealer {
    /// A sealer with a fresh random secret.
    pub fn new() -> Self {
        let mut secret = [0u8; 32];
        SystemRandom::new()
            .fill(&mut secret)
            .expect("the system's random source");
        Self {
            secret: hmac::Key::new(hmac::HMAC_SHA256, &secret),
        }
    }

    /// The key of the run whose scoped execution id is `execution_id`.
    pub fn key(&self, execution_id: &str) -> RunKey {
        let tag = hmac::sign(&self.secret, execution_id.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(tag.as_ref());
        RunKey(key)
    }
}

impl Default for Sealer {
    fn default() -> Self {
        Self::new()
    }
}

/// One run's key. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct RunKey([u8; 32]);

impl std::fmt::Debug for RunKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunKey(..)")
    }
}

impl RunKey {
    /// As the runner reads it from its stdin.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The report's bytes, when `file` is they followed by their valid seal.
    pub fn open<'a>(&self, file: &'a [u8]) -> Result<&'a [u8], SealError> {
        let seal_len = SEAL_PREFIX.len() + TAG_HEX + SEAL_SUFFIX.len();
        let split = file
            .len()
            .checked_sub(seal_len)
            .ok_or(SealError::Unsealed)?;
        let (body, seal) = file.split_at(split);
        let tag = seal
            .strip_prefix(SEAL_PREFIX.as_bytes())
            .and_then(|rest| rest.strip_suffix(SEAL_SUFFIX.as_bytes()))
            .and_then(|text| hex::decode(text).ok())
            .ok_or(SealError::Unsealed)?;
        hmac::verify(&hmac::Key::new(hmac::HMAC_SHA256, &self.0), body, &tag)
            .map_err(|_| SealError::Mismatch)?;
        Ok(body)
    }

    /// `body` followed by its seal, as the runner writes it.
    #[cfg(test)]
    pub fn seal(&self, body: &[u8]) -> Vec<u8> {
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &self.0), body);
        let mut file = body.to_vec();
        file.extend_from_slice(SEAL_PREFIX.as_bytes());
        file.extend_from_slice(hex::encode(tag.as_ref()).as_bytes());
        file.extend_from_slice(SEAL_SUFFIX.as_bytes());
        file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_report_opens_and_any_change_is_refused() {
        let sealer = Sealer::new();
        let key = sealer.key("acme.run-1");
        let file = key.seal(b"<testsuites/>\n");
        assert_eq!(key.open(&file).unwrap(), b"<testsuites/>\n");

        // Another run's key, another scheduler's, the body changed, the seal cut or absent.
        assert_eq!(
            sealer.key("beta.run-1").open(&file),
            Err(SealError::Mismatch)
        );
        assert_eq!(
            Sealer::new().key("acme.run-1").open(&file),
            Err(SealError::Mismatch)
        );
        let mut changed = file.clone();
        changed[1] = b'T';
        assert_eq!(key.open(&changed), Err(SealError::Mismatch));
        assert_eq!(key.open(&file[..file.len() - 1]), Err(SealError::Unsealed));
        assert_eq!(key.open(b"<testsuites/>"), Err(SealError::Unsealed));
        assert_eq!(key.open(b""), Err(SealError::Unsealed));
        // The same run's key again (a replay) opens it.
        assert_eq!(sealer.key("acme.run-1"), key);
        assert_eq!(format!("{key:?}"), "RunKey(..)");
    }
}
