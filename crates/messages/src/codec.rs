//! Encoding by `Content-Type`: JSON (the default when the header is absent) or MessagePack with
//! named fields. A service answers in the caller's encoding.
//!
//! Decoding is the one place a payload becomes a type, for every service and the HTTP gateway:
//! an error names where in the payload it is, and a field the type does not have is
//! [`CodecError::UnknownField`] — request types refuse them (`#[serde(deny_unknown_fields)]`),
//! because a field a server ignores, in a policy above all, is a downgrade nobody is told of.

use serde::de::{DeserializeOwned, Deserializer};
use serde::Serialize;
use serde_path_to_error::Segment;

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
    /// Boxed: every `Result` of the codec (and of the errors that wrap it) stays small.
    #[error(transparent)]
    UnknownField(Box<UnknownField>),
    #[error("could not encode payload: {0}")]
    Encode(String),
}

impl From<CodecError> for ErrorBody {
    fn from(e: CodecError) -> Self {
        match e {
            CodecError::Encode(_) => ErrorBody::internal(e.to_string()),
            CodecError::UnknownField(f) => ErrorBody::bad_request(f.to_string()).with_details(
                serde_json::json!({ "field": shown(&f.path), "expected": f.expected }),
            ),
            _ => ErrorBody::bad_request(e.to_string()),
        }
    }
}

/// A field the payload names that its type does not have, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown field `{}` in {} ({})",
    shown(field),
    within(object, of),
    expected_list(expected)
)]
pub struct UnknownField {
    /// The field as the payload names it.
    pub field: String,
    /// The path of the object without it (`network`, `files[0]`); empty at the payload's top.
    pub object: String,
    /// The payload's type (`SessionOpen`).
    pub of: &'static str,
    /// The field's own path (`network.allow`): what the error body's `details.field` says.
    pub path: String,
    /// The fields the object has.
    pub expected: Vec<String>,
}

/// Most characters of a name or path an error repeats: names are the caller's, and a reply
/// must stay far below the message size it answers.
const MAX_SHOWN_FIELD: usize = 64;

fn shown(field: &str) -> String {
    let escaped: String = field.escape_debug().collect();
    match escaped.char_indices().nth(MAX_SHOWN_FIELD) {
        Some((cut, _)) => format!("{}…", &escaped[..cut]),
        None => escaped,
    }
}

fn within(object: &str, of: &str) -> String {
    match object {
        "" => format!("`{of}`"),
        _ => format!("`{}` of `{of}`", shown(object)),
    }
}

fn expected_list(expected: &[String]) -> String {
    match expected {
        [] => "it has no fields".into(),
        [only] => format!("expected {only}"),
        _ => format!("expected one of: {}", expected.join(", ")),
    }
}

impl UnknownField {
    /// The unknown field a decoding error's `message` names, and the names the object has.
    /// The words are serde's own (`unknown field `x`, expected one of `a`, `b``, or `…, there
    /// are no fields`, and serde_json's ` at line L column C` after them); the field is the
    /// caller's and may hold anything, so the list of names is found from the end.
    fn parse(message: &str) -> Option<(&str, Vec<String>)> {
        let rest = message.strip_prefix("unknown field `")?;
        match rest.rfind("`, expected ") {
            Some(end) => {
                // Names are identifiers: every second piece between backticks is one.
                let list = &rest[end + "`, expected ".len()..];
                let names = list.split('`').skip(1).step_by(2).map(String::from);
                Some((&rest[..end], names.collect()))
            }
            None => Some((&rest[..rest.rfind("`, there are no fields")?], Vec::new())),
        }
    }

    /// The unknown field of `message`, raised at `at` in a payload of `of`: `at` ends with the
    /// field itself where the decoder read its name, and says where it is without it.
    fn at(message: &str, at: &serde_path_to_error::Path, of: &'static str) -> Option<Self> {
        let (field, expected) = Self::parse(message)?;
        let segments: Vec<_> = at.iter().collect();
        let object = match segments.split_last() {
            Some((Segment::Map { key }, object)) if key == field => object,
            _ => &segments[..],
        };
        let object = dotted(object);
        let path = match object.as_str() {
            "" => field.to_string(),
            _ => format!("{object}.{field}"),
        };
        Some(Self {
            field: field.to_string(),
            object,
            of,
            path,
            expected,
        })
    }
}

/// `segments` as a path is written: `network.allow_domains`, `files[0].path`; empty at the top.
fn dotted(segments: &[&Segment]) -> String {
    let mut path = String::new();
    for segment in segments {
        if !path.is_empty() && !matches!(segment, Segment::Seq { .. }) {
            path.push('.');
        }
        path.push_str(&segment.to_string());
    }
    path
}

/// The name of `T` without its module path (and without an `Option` around it), as the
/// OpenAPI document and the protocol reference name the payloads.
fn type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let bare = full
        .strip_prefix("core::option::Option<")
        .and_then(|inner| inner.strip_suffix('>'))
        .unwrap_or(full);
    bare.rsplit("::").next().unwrap_or(bare)
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
        match self {
            Encoding::Json => {
                let mut de = serde_json::Deserializer::from_slice(bytes);
                let value = self.tracked(&mut de)?;
                // Only whitespace may follow the value, as `serde_json::from_slice` has it.
                de.end().map_err(|e| self.malformed(e.to_string()))?;
                Ok(value)
            }
            Encoding::MsgPack => self.tracked(&mut rmp_serde::Deserializer::from_read_ref(bytes)),
        }
    }

    /// A JSON value already read (a body the HTTP gateway completed from its path) as `T`,
    /// with the errors of [`Encoding::decode`].
    pub fn decode_json_value<T: DeserializeOwned>(
        value: serde_json::Value,
    ) -> Result<T, CodecError> {
        Encoding::Json.tracked(value)
    }

    /// Decodes `T` from `de`, an error saying where it is in the payload.
    fn tracked<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        self,
        de: D,
    ) -> Result<T, CodecError> {
        serde_path_to_error::deserialize(de).map_err(|e| {
            let message = e.inner().to_string();
            if let Some(unknown) = UnknownField::at(&message, e.path(), type_name::<T>()) {
                return CodecError::UnknownField(Box::new(unknown));
            }
            let segments: Vec<_> = e.path().iter().collect();
            match dotted(&segments).as_str() {
                "" => self.malformed(message),
                at => self.malformed(format!("{}: {message}", shown(at))),
            }
        })
    }

    fn malformed(self, message: String) -> CodecError {
        CodecError::Malformed {
            encoding: self.name(),
            message,
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

    /// serde words the names an object has in three ways (none, one or two, more); each
    /// reads back as the list, in both encodings.
    #[test]
    fn the_names_an_object_has_are_read_back_however_serde_words_them() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Empty {}
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct One {
            a: Option<u8>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Two {
            a: Option<u8>,
            b: Option<u8>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Three {
            a: Option<u8>,
            b: Option<u8>,
            c: Option<Two>,
        }
        fn unknown<T: DeserializeOwned + std::fmt::Debug>(
            json: serde_json::Value,
        ) -> Vec<(UnknownField, String)> {
            let bytes = [
                (Encoding::Json, serde_json::to_vec(&json).unwrap()),
                (Encoding::MsgPack, rmp_serde::to_vec_named(&json).unwrap()),
            ];
            bytes
                .into_iter()
                .map(|(encoding, bytes)| match encoding.decode::<T>(&bytes) {
                    Err(CodecError::UnknownField(f)) => {
                        let shown = f.to_string();
                        (*f, shown)
                    }
                    other => panic!("{encoding:?}: {other:?}"),
                })
                .collect()
        }
        let x = serde_json::json!({"x": 1});
        for (f, shown) in unknown::<Empty>(x.clone()) {
            assert!(f.expected.is_empty());
            assert_eq!(shown, "unknown field `x` in `Empty` (it has no fields)");
        }
        for (_, shown) in unknown::<One>(x.clone()) {
            assert_eq!(shown, "unknown field `x` in `One` (expected a)");
        }
        for (f, _) in unknown::<Two>(x.clone()) {
            assert_eq!(f.expected, ["a", "b"]);
        }
        for (f, shown) in unknown::<Three>(serde_json::json!({"c": {"x": 1}})) {
            assert_eq!((f.object.as_str(), f.path.as_str()), ("c", "c.x"));
            assert_eq!(
                shown,
                "unknown field `x` in `c` of `Three` (expected one of: a, b)"
            );
        }
        for (f, _) in unknown::<Option<Three>>(x) {
            assert_eq!((f.of, f.expected.len()), ("Three", 3));
        }
    }

    /// Other errors say where they are too.
    #[test]
    fn a_malformed_value_is_named_by_its_path() {
        let e = Encoding::Json
            .decode::<crate::network::NetworkPolicy>(br#"{"ports": [443, "x"]}"#)
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("malformed JSON payload: ports[1]: invalid type"),
            "{e}"
        );
        let trailing = Encoding::Json.decode::<crate::network::NetworkPolicy>(b"{} {}");
        assert!(trailing.is_err(), "only whitespace may follow the value");
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
