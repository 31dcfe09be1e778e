//! The sample executions `sandmesh up --demo` prints: one per language, plus one the risk
//! policy refuses, so a new user sees the whole path work. Each has the status it must end
//! with: `up --once` is the README's first command and CI's end-to-end check, so a sample that
//! ends otherwise (a sandbox that cannot start, a policy that lets `rm -rf /` through) fails it.

use std::time::Duration;

use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language};
use messages::Subjects;

const SAMPLES: &[(Language, &str, ExecStatus)] = &[
    (
        Language::Python,
        "import platform\nprint(f'hello from python {platform.python_version()}')",
        ExecStatus::Ok,
    ),
    (
        Language::Javascript,
        "console.log(`hello from node ${process.version}`)",
        ExecStatus::Ok,
    ),
    (
        Language::Shell,
        "echo \"hello from $(bash --version | head -n1)\"",
        ExecStatus::Ok,
    ),
    (Language::Shell, "rm -rf /", ExecStatus::Rejected),
];

pub async fn run(client: &async_nats::Client, subjects: &Subjects) -> anyhow::Result<i32> {
    let caller = sandmesh_client::MeshClient::new(client.clone(), subjects.clone())
        .with_timeout(Duration::from_secs(120))
        .with_encoding(messages::Encoding::Json);
    let mut failures = 0;
    for (language, code, expected) in SAMPLES {
        let request = ExecRequest {
            language: *language,
            code: code.to_string(),
            requested_by: Some("sandmesh-up-demo".into()),
            ..Default::default()
        };
        outln!("$ sandmesh exec --lang {} {:?}", language.as_str(), code);
        match caller
            .request::<_, ExecResult>(subjects.exec(), &request)
            .await
        {
            Ok(r) => {
                out!("{}", r.stdout);
                eprint!("{}", r.stderr);
                outln!(
                    "  → status={} tier={} risk={} exec={}ms total={}ms{}",
                    r.status.as_str(),
                    r.tier.as_str(),
                    r.risk.level.as_str(),
                    r.timing.exec_ms,
                    r.timing.total_ms,
                    r.error
                        .map(|e| format!(" ({})", e.message))
                        .unwrap_or_default()
                );
                if r.status != *expected {
                    failures += 1;
                    outln!("  → expected status={}", expected.as_str());
                }
            }
            Err(e) => {
                failures += 1;
                outln!("  → failed: {e}");
            }
        }
    }
    Ok(if failures == 0 { 0 } else { 1 })
}
