//! Request validation shared by every service that accepts the same fields: ids, paths, env
//! names, sizes and limit ceilings. Each check returns a typed error that maps to 400 or 413.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::ErrorBody;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("{field} is {size} bytes; the limit is {limit}")]
    TooLarge {
        field: String,
        size: usize,
        limit: usize,
    },
}

impl ValidationError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ValidationError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<ValidationError> for ErrorBody {
    fn from(e: ValidationError) -> Self {
        match &e {
            ValidationError::Invalid { field, .. } => ErrorBody::bad_request(e.to_string())
                .with_details(serde_json::json!({ "field": field })),
            ValidationError::TooLarge { field, size, limit } => ErrorBody::too_large(e.to_string())
                .with_details(serde_json::json!({ "field": field, "size": size, "limit": limit })),
        }
    }
}

/// Longest id accepted for sessions and executions (they become subject tokens and KV keys).
pub const MAX_ID_LEN: usize = 64;

/// Session and execution ids: 1–64 of `[A-Za-z0-9_-]`, so they are safe as subject tokens,
/// KV keys and container names.
pub fn validate_id(field: &str, id: &str) -> Result<(), ValidationError> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(ValidationError::invalid(
            field,
            format!("must be 1..={MAX_ID_LEN} characters"),
        ));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ValidationError::invalid(
            field,
            "only letters, digits, '-' and '_' are allowed",
        ));
    }
    Ok(())
}

pub const MAX_PATH_BYTES: usize = 1024;
pub const MAX_NAME_BYTES: usize = 255;
pub const MAX_PATH_DEPTH: usize = 32;

/// Characters that look like path syntax to a person or to some layer that normalises Unicode
/// (fullwidth and other look-alike dots and slashes, backslash).
const LOOKALIKES: &[char] = &[
    '\\', '\u{FF0E}', '\u{FF0F}', '\u{2215}', '\u{2044}', '\u{2024}', '\u{FE52}',
];

/// Zero-width and bidirectional controls: `evil\u{202E}txt.exe` passes for another name in a
/// listing.
const INVISIBLE: &[char] = &[
    '\u{200B}', '\u{200C}', '\u{200D}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}',
    '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', '\u{FEFF}',
];

fn percent_decode_once(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A workspace path: relative, `/`-separated, each component a plain name. Refuses absolute
/// paths, `.`/`..` (also percent-encoded, once or twice), empty components, NUL and control
/// characters, backslashes and look-alike dots/slashes, invisible characters, over-long names
/// and paths. It is the one rule for a name in a workspace: the store applies it to what it
/// is given, and an executor to a run's changed files before it hands them to the store.
pub fn validate_relative_path(field: &str, path: &str) -> Result<(), ValidationError> {
    if path.is_empty() {
        return Err(ValidationError::invalid(field, "path is empty"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(ValidationError::invalid(
            field,
            format!("path is longer than {MAX_PATH_BYTES} bytes"),
        ));
    }
    if path.starts_with('/') {
        return Err(ValidationError::invalid(
            field,
            "absolute paths are not allowed",
        ));
    }
    if let Some(c) = path.chars().find(|c| c.is_control()) {
        return Err(ValidationError::invalid(
            field,
            format!("control character {:?} in path", c),
        ));
    }
    if let Some(c) = path.chars().find(|c| LOOKALIKES.contains(c)) {
        return Err(ValidationError::invalid(
            field,
            format!("character {c:?} is not allowed in paths"),
        ));
    }
    if let Some(c) = path.chars().find(|c| INVISIBLE.contains(c)) {
        return Err(ValidationError::invalid(
            field,
            format!("invisible character {c:?} is not allowed in paths"),
        ));
    }
    let components: Vec<&str> = path.split('/').collect();
    if components.len() > MAX_PATH_DEPTH {
        return Err(ValidationError::invalid(
            field,
            format!("path is deeper than {MAX_PATH_DEPTH}"),
        ));
    }
    for (i, c) in components.iter().enumerate() {
        if c.is_empty() {
            // One trailing slash ("dir/") is tolerated; "a//b" is not.
            if i == components.len() - 1 && i > 0 {
                continue;
            }
            return Err(ValidationError::invalid(field, "empty path component"));
        }
        if c.len() > MAX_NAME_BYTES {
            return Err(ValidationError::invalid(
                field,
                format!("a name is longer than {MAX_NAME_BYTES} bytes"),
            ));
        }
        let once = percent_decode_once(c);
        let twice = percent_decode_once(&once);
        if [*c, once.as_str(), twice.as_str()]
            .iter()
            .any(|d| *d == "." || *d == ".." || d.contains('/'))
        {
            return Err(ValidationError::invalid(
                field,
                "'.' and '..' components are not allowed",
            ));
        }
    }
    Ok(())
}

/// Env names a request may set: `[A-Za-z_][A-Za-z0-9_]*`, and none that steer the dynamic
/// loader or the interpreters' own start-up.
pub fn validate_env_name(name: &str) -> Result<(), ValidationError> {
    let field = format!("env.{name}");
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 128;
    if !ok {
        return Err(ValidationError::invalid(
            field,
            "env names are [A-Za-z_][A-Za-z0-9_]*, at most 128",
        ));
    }
    const RESERVED: &[&str] = &[
        "LD_",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONPATH",
        "NODE_OPTIONS",
        "BASH_ENV",
        "ENV",
        "SANDMESH_",
    ];
    if RESERVED.iter().any(|r| {
        if r.ends_with('_') {
            name.starts_with(r)
        } else {
            name == *r
        }
    }) {
        return Err(ValidationError::invalid(field, "this variable is reserved"));
    }
    Ok(())
}

/// The most a request may ask for, and what it gets when it asks for nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ceilings {
    pub max_code_bytes: usize,
    pub max_stdin_bytes: usize,
    pub max_files: usize,
    pub max_files_bytes: usize,
    pub max_env: usize,
    pub max_env_value_bytes: usize,
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    pub default_memory_mb: u64,
    pub max_memory_mb: u64,
    pub default_cpus: f64,
    pub max_cpus: f64,
    pub default_pids: u64,
    pub max_pids: u64,
    pub default_output_bytes: u64,
    pub max_output_bytes: u64,
}

impl Default for Ceilings {
    fn default() -> Self {
        Self {
            max_code_bytes: 256 * 1024,
            max_stdin_bytes: 256 * 1024,
            max_files: 64,
            max_files_bytes: 512 * 1024,
            max_env: 64,
            max_env_value_bytes: 4096,
            default_timeout_ms: 30_000,
            max_timeout_ms: 300_000,
            default_memory_mb: 256,
            max_memory_mb: 2048,
            default_cpus: 1.0,
            max_cpus: 2.0,
            default_pids: 128,
            max_pids: 512,
            default_output_bytes: 1024 * 1024,
            max_output_bytes: 8 * 1024 * 1024,
        }
    }
}

pub(crate) fn clamp_u64(
    field: &str,
    asked: Option<u64>,
    default: u64,
    max: u64,
) -> Result<u64, ValidationError> {
    match asked {
        None => Ok(default.min(max)),
        Some(0) => Err(ValidationError::invalid(field, "must be greater than 0")),
        Some(v) => Ok(v.min(max)),
    }
}

/// `TooLarge` when `size` exceeds `limit`.
pub fn check_size(field: &str, size: usize, limit: usize) -> Result<(), ValidationError> {
    if size > limit {
        Err(ValidationError::TooLarge {
            field: field.into(),
            size,
            limit,
        })
    } else {
        Ok(())
    }
}

/// Env variables as a request or a session sets them: at most `max_env` of them, each name
/// allowed ([`validate_env_name`]), each value within `max_env_value_bytes` and without NUL.
pub fn validate_env(env: &BTreeMap<String, String>, c: &Ceilings) -> Result<(), ValidationError> {
    if env.len() > c.max_env {
        return Err(ValidationError::invalid(
            "env",
            format!("at most {} variables", c.max_env),
        ));
    }
    for (name, value) in env {
        validate_env_name(name)?;
        check_size(&format!("env.{name}"), value.len(), c.max_env_value_bytes)?;
        if value.contains('\0') {
            return Err(ValidationError::invalid(
                format!("env.{name}"),
                "NUL bytes are not allowed",
            ));
        }
    }
    Ok(())
}

/// A timeout as asked (absent: `default`), clamped by the ceiling; zero is refused.
pub fn clamp_timeout(
    asked: Option<u64>,
    default: u64,
    c: &Ceilings,
) -> Result<u64, ValidationError> {
    clamp_u64("timeout_ms", asked, default, c.max_timeout_ms)
}

#[cfg(test)]
mod properties;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{validate_exec, ContentEncoding, ExecRequest, FileSpec, Language, Limits};

    fn req(code: &str) -> ExecRequest {
        ExecRequest {
            language: Language::Python,
            code: code.into(),
            ..Default::default()
        }
    }

    #[test]
    fn kernel_cells_need_a_python_session_without_stdin() {
        let c = Ceilings::default();
        let kernel = |session: Option<&str>, language, stdin: Option<&str>| ExecRequest {
            session_id: session.map(String::from),
            language,
            stdin: stdin.map(String::from),
            kernel: true,
            ..req("x = 1")
        };
        assert!(validate_exec(&kernel(Some("s1"), Language::Python, None), &c).is_ok());
        assert!(validate_exec(&kernel(Some("s1"), Language::Javascript, None), &c).is_ok());
        for bad in [
            kernel(None, Language::Python, None),
            kernel(Some("s1"), Language::Shell, None),
            kernel(Some("s1"), Language::Python, Some("in")),
        ] {
            let err = validate_exec(&bad, &c).unwrap_err();
            assert!(matches!(err, ValidationError::Invalid { .. }), "{err:?}");
        }
    }

    #[test]
    fn traversal_catalogue_is_refused() {
        for bad in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "a/./b",
            "a//b",
            "%2e%2e/x",
            "%252e%252e/x",
            "..\\x",
            "\u{FF0E}\u{FF0E}\u{FF0F}x",
            "evil\u{202E}txt.exe",
            "a\u{200B}b",
            "a\0b",
            "a\nb",
            "",
            ".",
            "..",
            "%2e",
            &"n".repeat(256),
            &"a/".repeat(40),
        ] {
            assert!(
                validate_relative_path("path", bad).is_err(),
                "accepted {bad:?}"
            );
        }
        for good in [
            "a",
            "code/main.py",
            "dir/",
            ".memory/task_plan.md",
            "a..b",
            "...x",
            "%41",
        ] {
            assert!(
                validate_relative_path("path", good).is_ok(),
                "refused {good:?}"
            );
        }
    }

    #[test]
    fn ids_are_subject_safe() {
        assert!(validate_id("id", "01JABCDEF_x-y").is_ok());
        for bad in ["", "a.b", "a*", "a b", "a>", &"x".repeat(65)] {
            assert!(validate_id("id", bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn env_names_are_checked() {
        assert!(validate_env_name("MY_VAR").is_ok());
        for bad in [
            "1X",
            "A-B",
            "LD_PRELOAD",
            "PYTHONSTARTUP",
            "",
            "A=B",
            "SANDMESH_TOKEN",
        ] {
            assert!(validate_env_name(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn limits_are_clamped_and_zero_is_refused() {
        let c = Ceilings::default();
        let mut r = req("print(1)");
        r.timeout_ms = Some(u64::MAX);
        r.limits = Some(Limits {
            memory_mb: Some(1 << 40),
            cpus: Some(64.0),
            pids: Some(1 << 30),
            max_output_bytes: None,
        });
        let l = validate_exec(&r, &c).unwrap();
        assert_eq!(l.timeout_ms, c.max_timeout_ms);
        assert_eq!(l.memory_mb, c.max_memory_mb);
        assert_eq!(l.cpus, c.max_cpus);
        assert_eq!(l.pids, c.max_pids);
        assert_eq!(l.max_output_bytes, c.default_output_bytes);

        r.timeout_ms = Some(0);
        assert!(matches!(
            validate_exec(&r, &c),
            Err(ValidationError::Invalid { .. })
        ));
        r.timeout_ms = None;
        r.limits = Some(Limits {
            cpus: Some(f64::NAN),
            ..Default::default()
        });
        assert!(validate_exec(&r, &c).is_err());
    }

    #[test]
    fn oversized_code_is_too_large_and_nul_is_invalid() {
        let c = Ceilings::default();
        let big = req(&"x".repeat(c.max_code_bytes + 1));
        let e = validate_exec(&big, &c).unwrap_err();
        assert_eq!(ErrorBody::from(e).code, 413);
        let e = validate_exec(&req("a\0b"), &c).unwrap_err();
        assert_eq!(ErrorBody::from(e).code, 400);
    }

    #[test]
    fn request_files_are_checked() {
        let c = Ceilings::default();
        let mut r = req("x");
        r.files = vec![FileSpec {
            path: "../evil".into(),
            content: "x".into(),
            encoding: ContentEncoding::Utf8,
        }];
        assert!(validate_exec(&r, &c).is_err());
        r.files = vec![FileSpec {
            path: "data/a.bin".into(),
            content: "!!".into(),
            encoding: ContentEncoding::Base64,
        }];
        assert!(validate_exec(&r, &c).is_err());
        r.files[0].content = "AAEC".into();
        assert!(validate_exec(&r, &c).is_ok());
    }
}
