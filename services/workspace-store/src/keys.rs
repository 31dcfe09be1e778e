//! Workspace paths and the KV keys they are stored under.
//!
//! A path is checked by `messages::validate::validate_relative_path`, the rule executors apply
//! to a run's changed files too (so what they hand over is never refused here). It is kept as
//! a list of components, never as a string that something might re-parse.
//!
//! Keys: `<session>.meta` holds a session's usage; `<session>.f.<c1>.<c2>…` one node (file or
//! directory), each component base64url-encoded so any name fits the KV key charset
//! `[-/_=.a-zA-Z0-9]` and `.` stays the separator. One token per component lets a listing of
//! a directory filter on `<session>.f.<dir…>.*` (or `.>` recursively): the server then visits
//! that subtree only, never other sessions.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use messages::validate::{validate_relative_path, ValidationError};

/// A key token that no session key uses: the sweeper's lock (sessions keys have two tokens+).
pub const SWEEP_LOCK_KEY: &str = "sweep";

/// A checked relative path inside one workspace. The root has no components.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath {
    parts: Vec<String>,
}

impl RelPath {
    pub fn root() -> Self {
        Self { parts: Vec::new() }
    }

    /// Parses a request path. A trailing `/` is accepted (it names a directory) and reported
    /// in the second value.
    pub fn parse(field: &str, raw: &str) -> Result<(Self, bool), ValidationError> {
        validate_relative_path(field, raw)?;
        let is_dir = raw.ends_with('/');
        let parts = raw
            .split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        Ok((Self { parts }, is_dir))
    }

    /// Parses an optional directory prefix: absent, empty or `.` means the root.
    pub fn parse_prefix(field: &str, raw: Option<&str>) -> Result<Self, ValidationError> {
        match raw.map(|r| r.trim_end_matches('/')) {
            None | Some("") | Some(".") => Ok(Self::root()),
            Some(p) => Ok(Self::parse(field, p)?.0),
        }
    }

    pub fn from_parts(parts: Vec<String>) -> Self {
        Self { parts }
    }

    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    pub fn parts(&self) -> &[String] {
        &self.parts
    }

    pub fn depth(&self) -> usize {
        self.parts.len()
    }

    pub fn parent(&self) -> Option<Self> {
        (!self.parts.is_empty()).then(|| Self {
            parts: self.parts[..self.parts.len() - 1].to_vec(),
        })
    }

    /// Every proper ancestor except the root, outermost first: `a/b/c` → `a`, `a/b`.
    pub fn ancestors(&self) -> Vec<Self> {
        (1..self.parts.len())
            .map(|n| Self {
                parts: self.parts[..n].to_vec(),
            })
            .collect()
    }

    pub fn starts_with(&self, prefix: &RelPath) -> bool {
        self.parts.len() >= prefix.parts.len() && self.parts[..prefix.parts.len()] == prefix.parts
    }

    pub fn join(&self, name: &str) -> Self {
        let mut parts = self.parts.clone();
        parts.push(name.to_string());
        Self { parts }
    }

    /// The path relative to `prefix` (which it must start with).
    pub fn strip(&self, prefix: &RelPath) -> Self {
        Self {
            parts: self.parts[prefix.parts.len()..].to_vec(),
        }
    }
}

impl std::fmt::Display for RelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.parts.join("/"))
    }
}

/// Session ids become key tokens: the shared id rule keeps them to `[A-Za-z0-9_-]`.
pub fn check_session(session: &str) -> Result<(), ValidationError> {
    messages::tenancy::validate_scoped_id("session_id", session)
}

pub fn meta_key(session: &str) -> String {
    format!("{session}.meta")
}

/// The key of one node: `<session>.f.<enc(c1)>.<enc(c2)>…`.
pub fn node_key(session: &str, path: &RelPath) -> String {
    let mut key = format!("{session}.f");
    for part in &path.parts {
        key.push('.');
        key.push_str(&URL_SAFE_NO_PAD.encode(part.as_bytes()));
    }
    key
}

/// The key filter of the nodes below `dir`: direct children, or the whole subtree.
pub fn children_filter(session: &str, dir: &RelPath, recursive: bool) -> String {
    format!(
        "{}.{}",
        node_key(session, dir),
        if recursive { ">" } else { "*" }
    )
}

/// Every key of a session (nodes and meta).
pub fn session_filter(session: &str) -> String {
    format!("{session}.>")
}

/// The filter matching every session's meta key.
pub fn all_meta_filter() -> String {
    "*.meta".to_string()
}

/// The path a node key names, or `None` for keys that are not nodes of `session`.
pub fn path_of_key(session: &str, key: &str) -> Option<RelPath> {
    let rest = key.strip_prefix(session)?.strip_prefix(".f")?;
    if rest.is_empty() {
        return Some(RelPath::root());
    }
    let parts = rest
        .strip_prefix('.')?
        .split('.')
        .map(|token| {
            let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
            String::from_utf8(bytes).ok()
        })
        .collect::<Option<Vec<_>>>()?;
    Some(RelPath { parts })
}

/// The session a meta key belongs to.
pub fn session_of_meta_key(key: &str) -> Option<&str> {
    key.strip_suffix(".meta").filter(|s| !s.contains('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_fit_the_kv_charset() {
        for raw in [
            "a",
            "code/main.py",
            ".memory/task_plan.md",
            "数据/文件 名.txt",
            "a-b_c=d",
        ] {
            let (path, _) = RelPath::parse("path", raw).unwrap();
            let key = node_key("s1", &path);
            assert!(
                key.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-/_=.".contains(c)),
                "{key}"
            );
            assert_eq!(path_of_key("s1", &key).unwrap().to_string(), raw);
            assert!(path_of_key("s2", &key).is_none());
        }
    }

    #[test]
    fn trailing_slash_names_a_directory() {
        let (p, is_dir) = RelPath::parse("path", "code/").unwrap();
        assert!(is_dir);
        assert_eq!(p.to_string(), "code");
        assert_eq!(
            RelPath::parse_prefix("prefix", Some("./")).unwrap(),
            RelPath::root()
        );
    }

    #[test]
    fn invisible_characters_are_refused() {
        assert!(RelPath::parse("path", "evil\u{202E}txt.exe").is_err());
        assert!(RelPath::parse("path", "a\u{200B}b").is_err());
    }

    #[test]
    fn ancestors_and_filters() {
        let (p, _) = RelPath::parse("path", "a/b/c").unwrap();
        let names: Vec<String> = p.ancestors().iter().map(|a| a.to_string()).collect();
        assert_eq!(names, ["a", "a/b"]);
        assert_eq!(children_filter("s", &RelPath::root(), false), "s.f.*");
        assert!(children_filter("s", &p, true).ends_with(".>"));
        assert_eq!(session_of_meta_key("s1.meta"), Some("s1"));
        assert_eq!(session_of_meta_key("s1.f.meta"), None);
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// Path-like strings: components that are plain, dots, encoded dots, empty or odd,
        /// joined by `/`, sometimes absolute or with a trailing slash.
        pub(crate) fn path_like() -> impl Strategy<Value = String> {
            let component = prop_oneof![
                4 => "[a-zA-Z0-9_.-]{1,12}",
                1 => Just("..".to_string()),
                1 => Just(".".to_string()),
                1 => Just(String::new()),
                1 => Just("%2e%2e".to_string()),
                1 => Just("%252e%252e".to_string()),
                1 => "\\PC{1,6}",
            ];
            let parts = proptest::collection::vec(component, 1..6);
            (any::<bool>(), parts, any::<bool>()).prop_map(|(absolute, parts, slash)| {
                let lead = if absolute { "/" } else { "" };
                let tail = if slash { "/" } else { "" };
                format!("{lead}{}{tail}", parts.join("/"))
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Whatever is accepted is a plain relative path that reads back as itself.
            #[test]
            fn accepted_paths_are_relative_plain_and_normal(
                raw in prop_oneof![path_like(), any::<String>()],
            ) {
                let Ok((path, _)) = RelPath::parse("path", &raw) else {
                    return Ok(());
                };
                prop_assert!(!raw.starts_with('/'));
                for part in path.parts() {
                    prop_assert!(!part.is_empty() && part != "." && part != "..", "{:?}", raw);
                    prop_assert!(!part.contains('/') && !part.contains('\0'), "{:?}", raw);
                }
                let shown = path.to_string();
                prop_assert_eq!(&shown, raw.strip_suffix('/').unwrap_or(&raw));
                let (again, is_dir) = RelPath::parse("path", &shown).unwrap();
                prop_assert_eq!(again, path);
                prop_assert!(!is_dir);
            }

            #[test]
            fn a_dotdot_component_or_an_absolute_path_is_refused(raw in path_like()) {
                let climbs = raw.split('/').any(|c| c == "..");
                if climbs || raw.starts_with('/') {
                    prop_assert!(RelPath::parse("path", &raw).is_err(), "{:?}", raw);
                }
            }
        }
    }
}
