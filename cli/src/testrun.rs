//! `sandmesh test`: runs a test file against a code file in the mesh (`sandbox.v1.test`) and
//! prints one line per test and the totals; exits 0 only when every test passed.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use messages::exec::Language;
use messages::testrun::{TestReport, TestRequest, TestRunStatus};
use sandmesh_client::MeshClient;

#[derive(clap::Args, Debug, Clone)]
pub struct TestArgs {
    /// python (pytest) or javascript (node --test).
    #[arg(long, default_value = "python")]
    pub language: Language,
    /// The module under test; the tests import it by its file name.
    #[arg(long)]
    pub code: PathBuf,
    /// The test file.
    #[arg(long)]
    pub tests: PathBuf,
    /// Run in this template (default: python-data for Python, which has pytest;
    /// node-default for JavaScript).
    #[arg(long)]
    pub template: Option<String>,
    /// Run in this (open) session, whose workspace keeps the files and the report.
    #[arg(long)]
    pub session: Option<String>,
    /// The whole run's time limit; tests still running then are cut off.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Print the whole report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(mesh: &MeshClient, args: TestArgs) -> anyhow::Result<i32> {
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    };
    let name = |path: &PathBuf| path.file_name().map(|n| n.to_string_lossy().into_owned());
    let req = TestRequest {
        session_id: args.session.clone(),
        language: args.language,
        code: read(&args.code)?,
        tests: read(&args.tests)?,
        code_file: name(&args.code),
        tests_file: name(&args.tests),
        template: args.template.clone(),
        timeout_ms: args.timeout_ms,
        requested_by: std::env::var("USER").ok().map(|u| format!("cli:{u}")),
        ..Default::default()
    };
    // Room for the tests' own time, a template build and a person deciding a confirmation.
    let wait = Duration::from_millis(args.timeout_ms.unwrap_or(30_000)) + Duration::from_secs(600);
    let report = mesh
        .exec()
        .run_tests_notified(&req, wait, |notice| {
            eprintln!("{}", crate::exec::waiting_line(&notice, messages::now_ms()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.into_body()))?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", sandmesh_client::exec::report_table(&report));
    }
    Ok(exit_code(&report))
}

fn exit_code(report: &TestReport) -> i32 {
    match report.status {
        TestRunStatus::Passed => 0,
        TestRunStatus::Failed => 1,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_says_passed_failed_or_no_report() {
        let report = |status| TestReport {
            status,
            ..Default::default()
        };
        assert_eq!(exit_code(&report(TestRunStatus::Passed)), 0);
        assert_eq!(exit_code(&report(TestRunStatus::Failed)), 1);
        assert_eq!(exit_code(&report(TestRunStatus::Timeout)), 2);
        assert_eq!(exit_code(&report(TestRunStatus::Denied)), 2);
    }
}
