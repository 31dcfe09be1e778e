//! Encoding by `Content-Type`: JSON (the default when the header is absent) or MessagePack with
//! named fields. A service answers in the caller's encoding.

use serde::{de::DeserializeOwned, Serialize};

use crate::error::ErrorBody;

pub const CONTENT_TYPE: &str = "Content-Type";
pub const ACCEPT: &str = "Accept";
pub const JSON: &str = "application/json";
pub const MSGPACK: &str = "application/msgpack";
/// The NATS micro error headers.
pub const SERVICE_ERROR: &str = "Nats-Service-Error";
pub const SERVICE_ERROR_CODE: &str = "Nats-Service-Error-Code";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    #[default]
    Json,
    MsgPack,
}

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("unsupported content type {0:?}; supported: application/json, application/msgpack")]
    UnsupportedContentType(String),
    #[error("malformed {encoding} payload: {message}")]
    Malformed {
        encoding: &'static str,
        message: String,
    },
    #[error("could not encode payload: {0}")]
    Encode(String),
}

impl From<CodecError> for ErrorBody {
    fn from(e: CodecError) -> Self {
        match e {
            CodecError::Encode(_) => ErrorBody::internal(e.to_string()),
            _ => ErrorBody::bad_request(e.to_string()),
        }
    }
}

impl Encoding {
    /// Chooses the encoding for a `Content-Type` header value; `None` means JSON. Parameters
    /// such as `; charset=utf-8` are ignored.
    pub fn from_content_type(value: Option<&str>) -> Result<Self, CodecError> {
        let Some(value) = value else {
            return Ok(Encoding::Json);
        };
        let essence = value
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "" | JSON | "text/json" => Ok(Encoding::Json),
            MSGPACK | "application/x-msgpack" | "application/vnd.msgpack" => Ok(Encoding::MsgPack),
            _ => Err(CodecError::UnsupportedContentType(value.to_string())),
        }
    }

    pub const fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => JSON,
            Encoding::MsgPack => MSGPACK,
        }
    }

    const fn name(self) -> &'static str {
        match self {
            Encoding::Json => "JSON",
            Encoding::MsgPack => "MessagePack",
        }
    }

    pub fn encode<T: Serialize + ?Sized>(self, value: &T) -> Result<Vec<u8>, CodecError> {
        match self {
            Encoding::Json => {
                serde_json::to_vec(value).map_err(|e| CodecError::Encode(e.to_string()))
            }
            // Named fields: positional msgpack breaks with optional fields and other languages.
            Encoding::MsgPack => {
                rmp_serde::to_vec_named(value).map_err(|e| CodecError::Encode(e.to_string()))
            }
        }
    }

    pub fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, CodecError> {
        let malformed = |message: String| CodecError::Malformed {
            encoding: self.name(),
            message,
        };
        match self {
            Encoding::Json => serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string())),
            Encoding::MsgPack => rmp_serde::from_slice(bytes).map_err(|e| malformed(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_header_means_json_and_parameters_are_ignored() {
        assert_eq!(Encoding::from_content_type(None).unwrap(), Encoding::Json);
        assert_eq!(
            Encoding::from_content_type(Some("application/json; charset=utf-8")).unwrap(),
            Encoding::Json
        );
        assert_eq!(
            Encoding::from_content_type(Some("Application/MsgPack")).unwrap(),
            Encoding::MsgPack
        );
    }

    #[test]
    fn unknown_content_type_is_a_bad_request() {
        let err = Encoding::from_content_type(Some("text/xml")).unwrap_err();
        assert!(matches!(err, CodecError::UnsupportedContentType(_)));
        assert_eq!(ErrorBody::from(err).code, 400);
    }

    #[test]
    fn msgpack_is_a_map_with_named_fields() {
        let bytes = Encoding::MsgPack
            .encode(&ErrorBody::not_found("x"))
            .unwrap();
        // 0x8_ is a fixmap: fields travel by name, not position.
        assert_eq!(bytes[0] & 0xf0, 0x80);
    }
}

/// Bytes as each encoding carries them best: a base64 string in JSON, `bin` in MessagePack
/// (`#[serde(with = "crate::codec::bytes_b64")]`).
pub mod bytes_b64 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&crate::encode_base64(bytes))
        } else {
            serde_bytes::serialize(bytes, s)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        if d.is_human_readable() {
            let text = String::deserialize(d)?;
            crate::decode_base64(&text).map_err(D::Error::custom)
        } else {
            serde_bytes::deserialize(d)
        }
    }
}
