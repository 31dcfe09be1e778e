//! The sandmesh wire protocol: every payload, every subject, the codec, and validation helpers.
//! Protocol only — no tokio, no ractor — so a client in any Rust program can depend on it, and
//! `testdata/` holds golden JSON and MessagePack vectors for clients in other languages.

pub mod audit;
pub mod browser;
pub mod code;
pub mod codec;
pub mod confirm;
pub mod error;
pub mod exec;
pub mod executor;
pub mod filesystem;
pub mod heartbeat;
pub mod network;
pub mod ports;
pub mod proc;
pub mod quota;
pub mod risk;
pub mod service;
pub mod session;
pub mod slot_share;
pub mod subjects;
pub mod template;
pub mod tenancy;
pub mod testrun;
pub mod validate;
pub mod workspace;

pub use codec::{CodecError, Encoding};
pub use error::{ErrorBody, ErrorKind};
pub use service::ServiceName;
pub use subjects::Subjects;

use base64::Engine as _;

/// A new ULID: sortable by creation time, used for execution, session and event ids.
pub fn new_id() -> String {
    ulid::Ulid::new().to_string()
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub fn encode_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("invalid base64: {e}"))
}

/// Bytes of a `content` field in the given encoding.
pub fn decode_content(content: &str, encoding: exec::ContentEncoding) -> Result<Vec<u8>, String> {
    match encoding {
        exec::ContentEncoding::Utf8 => Ok(content.as_bytes().to_vec()),
        exec::ContentEncoding::Base64 => decode_base64(content),
    }
}

/// Content as it travels: UTF-8 text when it is, base64 otherwise.
pub fn encode_content(bytes: &[u8]) -> (String, exec::ContentEncoding) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_string(), exec::ContentEncoding::Utf8),
        Err(_) => (encode_base64(bytes), exec::ContentEncoding::Base64),
    }
}
