//! The programs the loadtest runs: the tiny ones every figure is about, and the hostile ones
//! of the mixed blend.

use messages::exec::{ExecRequest, Language, Limits, TierChoice};

/// The smallest useful program per language, its expected output, and the same command as a
/// bare `docker exec` argv (what the baseline runs).
pub fn tiny(language: Language) -> (&'static str, &'static str, &'static [&'static str]) {
    match language {
        Language::Python => ("print(1)", "1\n", &["python3", "-c", "print(1)"]),
        Language::Javascript => ("console.log(1)", "1\n", &["node", "-e", "console.log(1)"]),
        Language::Shell => ("echo 1", "1\n", &["bash", "-c", "echo 1"]),
    }
}

/// An execution request with a fresh id.
pub fn request(
    language: Language,
    code: &str,
    tier: TierChoice,
    session: Option<&str>,
) -> ExecRequest {
    ExecRequest {
        execution_id: Some(messages::new_id()),
        session_id: session.map(str::to_string),
        language,
        code: code.to_string(),
        tier,
        timeout_ms: Some(10_000),
        requested_by: Some("loadtest".into()),
        ..Default::default()
    }
}

/// One entry of the mixed blend: a name to count results under, a weight, and the request.
pub struct Program {
    pub name: &'static str,
    pub weight: u32,
    pub build: fn() -> ExecRequest,
}

fn with(language: Language, code: &str, timeout_ms: u64, limits: Option<Limits>) -> ExecRequest {
    ExecRequest {
        timeout_ms: Some(timeout_ms),
        limits,
        ..request(language, code, TierChoice::Auto, None)
    }
}

/// Mostly ordinary work, with one in ten programs hostile. Each hostile one names the status
/// a correct mesh answers with (or `rejected`, when the risk policy refuses it up front).
pub const MIXED: &[Program] = &[
    Program {
        name: "python-print",
        weight: 30,
        build: || with(Language::Python, "print(1)", 10_000, None),
    },
    Program {
        name: "python-compute",
        weight: 15,
        build: || {
            with(
                Language::Python,
                "print(sum(i * i for i in range(200000)))",
                10_000,
                None,
            )
        },
    },
    Program {
        name: "javascript",
        weight: 20,
        build: || {
            with(
                Language::Javascript,
                "console.log([1,2,3].map(x => x * 2).join(','))",
                10_000,
                None,
            )
        },
    },
    Program {
        name: "shell",
        weight: 20,
        build: || with(Language::Shell, "echo hello | tr a-z A-Z", 10_000, None),
    },
    Program {
        name: "python-error",
        weight: 5,
        build: || with(Language::Python, "raise SystemExit(3)", 10_000, None),
    },
    // Expected: rejected, or killed / error within the pids limit.
    Program {
        name: "fork-bomb",
        weight: 2,
        build: || with(Language::Shell, "f() { f | f & }; f", 3_000, None),
    },
    // Expected: timeout.
    Program {
        name: "sleeper",
        weight: 3,
        build: || with(Language::Python, "import time\ntime.sleep(60)", 1_000, None),
    },
    // Expected: output_limit.
    Program {
        name: "stdout-bomb",
        weight: 2,
        build: || {
            with(
                Language::Python,
                "while True:\n    print('x' * 4096)",
                5_000,
                Some(Limits {
                    max_output_bytes: Some(64 * 1024),
                    ..Default::default()
                }),
            )
        },
    },
    // Expected: oom.
    Program {
        name: "memory-bomb",
        weight: 3,
        build: || {
            with(
                Language::Python,
                "a = []\nwhile True:\n    a.append(bytearray(8 << 20))",
                5_000,
                Some(Limits {
                    memory_mb: Some(64),
                    ..Default::default()
                }),
            )
        },
    },
];

/// The program at position `seq`: each program once first (so a short run still meets every
/// hostile one), then a deterministic weighted cycle through `programs`.
pub fn pick(programs: &[Program], seq: u64) -> &Program {
    if let Some(p) = programs.get(seq as usize) {
        return p;
    }
    let total: u64 = programs.iter().map(|p| u64::from(p.weight)).sum();
    // splitmix64's finaliser: consecutive sequence numbers land all over the cycle, so any
    // stretch of a run follows the weights.
    let mut z = seq.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let mut slot = (z ^ (z >> 31)) % total.max(1);
    for p in programs {
        if slot < u64::from(p.weight) {
            return p;
        }
        slot -= u64::from(p.weight);
    }
    &programs[0]
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn the_blend_follows_the_weights() {
        let mut seen: HashMap<&str, u64> = HashMap::new();
        let total: u64 = MIXED.iter().map(|p| u64::from(p.weight)).sum();
        // A stretch as long as a default run, not whole cycles: the spread must hold there.
        let n = 3_000;
        for seq in 0..n {
            *seen.entry(pick(MIXED, seq).name).or_default() += 1;
        }
        for p in MIXED {
            let share = seen[p.name] as f64 / n as f64;
            let want = f64::from(p.weight) / total as f64;
            assert!(
                (share - want).abs() < 0.01 + want * 0.25,
                "{}: {share} vs {want}",
                p.name
            );
        }
    }

    #[test]
    fn a_short_run_meets_every_program() {
        let names: Vec<&str> = (0..MIXED.len() as u64)
            .map(|s| pick(MIXED, s).name)
            .collect();
        let all: Vec<&str> = MIXED.iter().map(|p| p.name).collect();
        assert_eq!(names, all);
    }

    #[test]
    fn every_request_has_its_own_id() {
        let a = (MIXED[0].build)();
        let b = (MIXED[0].build)();
        assert_ne!(a.execution_id, b.execution_id);
        assert!(a.execution_id.is_some());
    }

    #[test]
    fn tiny_programs_match_their_bare_commands() {
        for l in Language::ALL {
            let (code, out, argv) = tiny(*l);
            assert!(argv.last().unwrap().contains(code), "{code} vs {argv:?}");
            assert_eq!(out, "1\n");
        }
    }
}
