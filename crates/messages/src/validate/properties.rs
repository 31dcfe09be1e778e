//! Property tests of `validate_exec`: arbitrary requests never panic it, and whatever it
//! accepts stays within the ceilings and the request size limits.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::exec::{validate_exec, ContentEncoding, ExecRequest, FileSpec, Language, Limits};

/// Numbers as a client may send them: none, zero, small, at a ceiling, huge.
fn amount() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        2 => Just(None),
        1 => Just(Some(0)),
        4 => (1u64..100_000).prop_map(Some),
        2 => any::<u64>().prop_map(Some),
    ]
}

fn cpus() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        3 => Just(None),
        6 => (0.0..16.0f64).prop_map(Some),
        1 => Just(Some(-1.0)),
        1 => Just(Some(f64::NAN)),
        1 => Just(Some(f64::INFINITY)),
        1 => Just(Some(f64::MIN_POSITIVE)),
    ]
}

fn limits() -> impl Strategy<Value = Option<Limits>> {
    proptest::option::of((amount(), cpus(), amount(), amount()).prop_map(
        |(memory_mb, cpus, pids, max_output_bytes)| Limits {
            memory_mb,
            cpus,
            pids,
            max_output_bytes,
        },
    ))
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "\\PC{0,12}",
        1 => any::<String>(),
        1 => Just("a\0b".to_string()),
    ]
}

fn file() -> impl Strategy<Value = FileSpec> {
    let encoding = prop_oneof![
        4 => Just(ContentEncoding::Utf8),
        1 => Just(ContentEncoding::Base64),
    ];
    let path = prop_oneof![
        8 => "[a-z]{1,8}(/[a-z]{1,8}){0,3}",
        1 => Just("../etc/passwd".to_string()),
        1 => Just("/abs".to_string()),
        1 => any::<String>(),
    ];
    (path, text(), encoding).prop_map(|(path, content, encoding)| FileSpec {
        path,
        content,
        encoding,
    })
}

fn request() -> impl Strategy<Value = ExecRequest> {
    // Mostly well-formed, so that many requests get through to the limits.
    let id = proptest::option::of(prop_oneof![8 => "[A-Za-z0-9_-]{1,64}", 1 => any::<String>()]);
    let env = proptest::collection::btree_map(
        prop_oneof![8 => "[A-Z_][A-Z0-9_]{0,10}", 1 => any::<String>()],
        text(),
        0..4,
    );
    (
        (id.clone(), id, text(), proptest::option::of(text())),
        (amount(), limits(), env),
        proptest::collection::vec(file(), 0..4),
    )
        .prop_map(
            |((execution_id, session_id, code, stdin), (timeout_ms, limits, env), files)| {
                ExecRequest {
                    execution_id,
                    session_id,
                    language: Language::Python,
                    code,
                    stdin,
                    timeout_ms,
                    limits,
                    env: env.into_iter().collect::<BTreeMap<_, _>>(),
                    files,
                    ..Default::default()
                }
            },
        )
}

/// Ceilings an operator may set; each maximum at least the floor `validate_exec` applies
/// (16 MB of memory, 8 pids), below which no limit could honour it.
fn ceilings() -> impl Strategy<Value = Ceilings> {
    (
        (1u64..1_000_000, 16u64..1_000_000, 0.1..64.0f64),
        (8u64..100_000, 1u64..1 << 40, 0usize..8),
    )
        .prop_map(
            |((timeout, memory, cpus), (pids, output, files))| Ceilings {
                max_timeout_ms: timeout,
                max_memory_mb: memory,
                max_cpus: cpus,
                max_pids: pids,
                max_output_bytes: output,
                max_files: files,
                max_code_bytes: 32,
                max_env_value_bytes: 16,
                ..Ceilings::default()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn accepted_requests_stay_within_the_ceilings(req in request(), c in ceilings()) {
        let Ok(l) = validate_exec(&req, &c) else {
            return Ok(());
        };
        prop_assert!((1..=c.max_timeout_ms).contains(&l.timeout_ms), "{:?}", l);
        prop_assert!((16..=c.max_memory_mb).contains(&l.memory_mb), "{:?}", l);
        prop_assert!(l.cpus.is_finite() && l.cpus > 0.0 && l.cpus <= c.max_cpus, "{:?}", l);
        prop_assert!((8..=c.max_pids).contains(&l.pids), "{:?}", l);
        prop_assert!((1..=c.max_output_bytes).contains(&l.max_output_bytes), "{:?}", l);
        prop_assert!(req.code.len() <= c.max_code_bytes && !req.code.contains('\0'));
        prop_assert!(req.files.len() <= c.max_files);
        for f in &req.files {
            prop_assert!(validate_relative_path("path", &f.path).is_ok());
        }
        for (name, value) in &req.env {
            prop_assert!(validate_env_name(name).is_ok());
            prop_assert!(value.len() <= c.max_env_value_bytes && !value.contains('\0'));
        }
    }

    /// What a request asks for within the ceilings it gets (above the floors).
    #[test]
    fn limits_within_the_ceilings_are_kept(req in request()) {
        let c = Ceilings::default();
        let Ok(l) = validate_exec(&req, &c) else {
            return Ok(());
        };
        if let Some(t) = req.timeout_ms.filter(|t| *t <= c.max_timeout_ms) {
            prop_assert_eq!(l.timeout_ms, t);
        }
        let asked = req.limits.unwrap_or_default();
        if let Some(m) = asked.memory_mb.filter(|m| (16..=c.max_memory_mb).contains(m)) {
            prop_assert_eq!(l.memory_mb, m);
        }
        if let Some(p) = asked.pids.filter(|p| (8..=c.max_pids).contains(p)) {
            prop_assert_eq!(l.pids, p);
        }
    }

    #[test]
    fn arbitrary_paths_and_ids_never_panic(s in any::<String>()) {
        let _ = validate_relative_path("path", &s);
        let _ = validate_id("id", &s);
        let _ = validate_env_name(&s);
    }
}
