//! How an execution ended, as the result's status: what the supervisor reported (exit,
//! signal, timeout, output cap, OOM, pids limit) and how the exchange ended (no report,
//! backstop deadline, flood), classified into `ExecResult`.

use messages::exec::{
    CellError, ContentEncoding, ExecResult, ExecStatus, OutputKind, RichOutput, Usage,
};
use messages::validate::validate_relative_path;
use messages::{ErrorBody, ErrorKind};
use sandbox_protocol::{Outcome, RunReport};

use crate::changes;
use crate::exchange::{Ending, Exchange};
use crate::job::Job;

pub fn base_result(job: &Job) -> ExecResult {
    ExecResult {
        execution_id: job.run.execution_id.clone(),
        session_id: job.run.session_id().map(Into::into),
        tier: job.run.tier(),
        session_restored: job.run.session_restored,
        ..Default::default()
    }
}

/// Paths the supervisor reported, kept only when they are plain workspace paths.
pub fn safe_paths(paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .filter(|p| validate_relative_path("path", p).is_ok())
        .cloned()
        .collect()
}

/// A kernel cell's outputs as the result carries them: only the known MIME types, and an
/// artifact only at a plain path under the workspace's `artifacts/` (the kernel is not
/// trusted; the supervisor bounded the sizes).
fn rich_outputs(outputs: &[sandbox_protocol::RichOutput]) -> Vec<RichOutput> {
    outputs
        .iter()
        .filter(|o| sandbox_protocol::OUTPUT_MIME_TYPES.contains(&o.mime_type.as_str()))
        .filter_map(|o| {
            let path = match &o.path {
                Some(p) if !is_artifact(p) => return None,
                path => path.clone(),
            };
            Some(RichOutput {
                kind: match o.kind {
                    sandbox_protocol::OutputKind::Result => OutputKind::Result,
                    sandbox_protocol::OutputKind::Display => OutputKind::Display,
                },
                mime_type: o.mime_type.clone(),
                content: o.content.clone(),
                encoding: if o.base64 {
                    ContentEncoding::Base64
                } else {
                    ContentEncoding::Utf8
                },
                path,
            })
        })
        .collect()
}

/// A plain workspace path under `artifacts/`.
fn is_artifact(path: &str) -> bool {
    let under = path
        .strip_prefix(sandbox_protocol::ARTIFACTS_DIR)
        .is_some_and(|rest| rest.starts_with('/'));
    under && validate_relative_path("path", path).is_ok()
}

/// Turns what the supervisor said (and how the exchange ended) into the result's status.
pub fn classify(job: &Job, report: Option<&RunReport>, ex: &Exchange) -> ExecResult {
    let mut r = base_result(job);
    r.stdout = String::from_utf8_lossy(&ex.stdout).into_owned();
    r.stderr = String::from_utf8_lossy(&ex.stderr).into_owned();
    let limits = &job.limits;
    let Some(report) = report else {
        let (status, error) = match &ex.ending {
            Ending::Deadline => (
                ExecStatus::Timeout,
                ErrorBody::timeout(format!(
                    "no result within the {} ms timeout and the kill grace; the container was \
                     killed",
                    limits.timeout_ms
                )),
            ),
            Ending::Flood => {
                r.stdout_truncated = true;
                (
                    ExecStatus::OutputLimit,
                    ErrorBody::too_large(format!(
                        "output passed {} bytes; the container was killed",
                        limits.max_output_bytes
                    )),
                )
            }
            other => (
                ExecStatus::Killed,
                ErrorBody::internal(format!(
                    "the execution ended without a result ({other:?}): {}",
                    ex.supervisor_log.trim()
                )),
            ),
        };
        r.status = status;
        r.error = Some(error);
        return r;
    };
    r.stdout_truncated = report.stdout_truncated;
    r.stderr_truncated = report.stderr_truncated;
    // Files are reported where they last: in a session's workspace. What a sessionless
    // single-use sandbox wrote dies with it, whatever the backend.
    if job.run.session_id().is_some() {
        let screened = changes::screen(report);
        r.files_created = screened.created;
        r.files_modified = screened.modified;
        r.files_refused = screened.refused;
        r.files_omitted = report.files_omitted;
    }
    r.outputs = rich_outputs(&report.outputs);
    r.cell_error = report.cell_error.as_ref().map(|e| CellError {
        name: e.name.clone(),
        value: e.value.clone(),
        traceback: e.traceback.clone(),
    });
    // A session re-placed on another node lost its kernel with its old container.
    r.state_lost = report.state_lost || (job.run.request().kernel && job.run.session_restored);
    r.usage = Some(Usage {
        peak_memory_bytes: report.peak_memory_bytes,
        cpu_ms: report.cpu_ms,
    });
    let oom = || {
        ErrorBody::new(
            ErrorKind::TooLarge,
            format!("the memory limit of {} MiB was exceeded", limits.memory_mb),
        )
    };
    let (status, exit_code, error) = match &report.outcome {
        Outcome::Exited { code: 0 } => (ExecStatus::Ok, Some(0), None),
        Outcome::Exited { code } if report.oom_killed => {
            (ExecStatus::Oom, Some(i64::from(*code)), Some(oom()))
        }
        Outcome::Exited { code } => (ExecStatus::Error, Some(i64::from(*code)), None),
        Outcome::Signaled { signal } => {
            let code = Some(128 + i64::from(*signal));
            if report.oom_killed && *signal == 9 {
                (ExecStatus::Oom, code, Some(oom()))
            } else if *signal == 9 {
                (ExecStatus::Killed, code, None)
            } else {
                (ExecStatus::Error, code, None)
            }
        }
        Outcome::Timeout => (
            ExecStatus::Timeout,
            None,
            Some(ErrorBody::timeout(format!(
                "killed after the {} ms timeout",
                limits.timeout_ms
            ))),
        ),
        Outcome::OutputLimit => (
            ExecStatus::OutputLimit,
            None,
            Some(ErrorBody::too_large(format!(
                "output passed {} bytes; it was cut and the program killed",
                limits.max_output_bytes
            ))),
        ),
        Outcome::Failed { message } => (
            ExecStatus::Internal,
            None,
            Some(ErrorBody::internal(message.clone())),
        ),
        Outcome::KernelDied if report.oom_killed => (ExecStatus::Oom, None, Some(oom())),
        Outcome::KernelDied => (
            ExecStatus::Killed,
            None,
            Some(ErrorBody::internal(
                "the kernel died during the cell; the next cell starts a new one, without \
                 the variables of earlier cells",
            )),
        ),
    };
    r.status = status;
    r.exit_code = exit_code;
    r.error = error;
    if r.files_omitted > 0 {
        r.error
            .get_or_insert_with(|| changes::omitted_error(r.files_omitted));
    }
    if report.pids_limit_hit && r.status != ExecStatus::Ok {
        let note = format!("the process limit of {} was reached", limits.pids);
        let e = r
            .error
            .get_or_insert_with(|| ErrorBody::new(ErrorKind::TooLarge, note.clone()));
        e.details =
            Some(serde_json::json!({ "pids_limit_hit": true, "pids": limits.pids, "note": note }));
    }
    r
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use messages::exec::{validate_exec, ExecRequest, Language};
    use messages::executor::{ExecutorRun, RunKind};
    use messages::validate::Ceilings;

    use super::*;

    /// A run of session `s1`, whose files last in its workspace.
    fn job() -> Job {
        job_of(Some("s1"))
    }

    fn job_of(session: Option<&str>) -> Job {
        let request = ExecRequest {
            language: Language::Python,
            code: "x".into(),
            session_id: session.map(Into::into),
            ..Default::default()
        };
        let kind = match session {
            Some(s) => RunKind::Session {
                session_id: s.into(),
            },
            None => RunKind::Pooled,
        };
        Job {
            limits: validate_exec(&request, &Ceilings::default()).unwrap(),
            run: ExecutorRun::new("e1".into(), request, kind).unwrap(),
            accepted: Instant::now(),
            retried: false,
        }
    }

    fn exchange(ending: Ending) -> Exchange {
        Exchange {
            ending,
            report: None,
            stdout: b"out \xff".to_vec(),
            stderr: Vec::new(),
            changes: Vec::new(),
            supervisor_log: "gone".into(),
        }
    }

    fn status(outcome: Outcome, oom: bool, pids: bool) -> ExecResult {
        let mut report = RunReport::failed("");
        report.outcome = outcome;
        report.oom_killed = oom;
        report.pids_limit_hit = pids;
        report.files_created = vec!["ok.txt".into(), "../escape".into(), "/abs".into()];
        classify(&job(), Some(&report), &exchange(Ending::Reported))
    }

    #[test]
    fn files_are_reported_only_where_they_last() {
        let mut report = RunReport::failed("");
        report.outcome = Outcome::Exited { code: 0 };
        report.files_created = vec!["made.txt".into()];
        report.files_modified = vec!["changed.txt".into()];
        let ended = exchange(Ending::Reported);
        let r = classify(&job_of(None), Some(&report), &ended);
        assert!(
            r.files_created.is_empty() && r.files_modified.is_empty(),
            "{r:?}"
        );
        let r = classify(&job(), Some(&report), &ended);
        assert_eq!(
            (r.files_created, r.files_modified),
            (
                vec!["made.txt".to_string()],
                vec!["changed.txt".to_string()]
            )
        );
    }

    #[test]
    fn changes_past_what_a_run_carries_are_counted_with_an_error_naming_the_limit() {
        let mut report = RunReport::failed("");
        report.outcome = Outcome::Exited { code: 0 };
        report.files_created = vec!["result.csv".into()];
        let ended = exchange(Ending::Reported);
        let r = classify(&job(), Some(&report), &ended);
        assert_eq!(
            (r.status, r.files_omitted, r.error),
            (ExecStatus::Ok, 0, None)
        );
        report.files_omitted = 50_001;
        let r = classify(&job(), Some(&report), &ended);
        assert_eq!((r.status, r.files_omitted), (ExecStatus::Ok, 50_001));
        assert_eq!(r.files_created, vec!["result.csv"]);
        let e = r.error.expect("an error naming the limit");
        assert_eq!(e.kind, ErrorKind::TooLarge);
        let details = e.details.unwrap();
        assert_eq!(
            details["max_changed_paths"],
            sandbox_protocol::MAX_CHANGED_PATHS
        );
        assert_eq!(details["files_omitted"], 50_001);
    }

    #[test]
    fn outcomes_map_to_statuses() {
        let r = status(Outcome::Exited { code: 0 }, false, false);
        assert_eq!(
            (r.status, r.exit_code, r.error),
            (ExecStatus::Ok, Some(0), None)
        );
        assert_eq!(r.stdout, "out \u{FFFD}", "lossy UTF-8");
        assert_eq!(
            r.files_created,
            vec!["ok.txt"],
            "unsafe paths from the sandbox dropped"
        );
        assert_eq!(
            status(Outcome::Exited { code: 2 }, false, false).status,
            ExecStatus::Error
        );
        assert_eq!(
            status(Outcome::Exited { code: 137 }, true, false).status,
            ExecStatus::Oom
        );
        let r = status(Outcome::Signaled { signal: 9 }, true, false);
        assert_eq!((r.status, r.exit_code), (ExecStatus::Oom, Some(137)));
        assert_eq!(
            status(Outcome::Signaled { signal: 9 }, false, false).status,
            ExecStatus::Killed
        );
        assert_eq!(
            status(Outcome::Signaled { signal: 11 }, false, false).status,
            ExecStatus::Error
        );
        assert_eq!(
            status(Outcome::Timeout, false, false).status,
            ExecStatus::Timeout
        );
        assert_eq!(
            status(Outcome::OutputLimit, false, false).status,
            ExecStatus::OutputLimit
        );
        let failed = Outcome::Failed {
            message: "no python".into(),
        };
        assert_eq!(status(failed, false, false).status, ExecStatus::Internal);
        let r = status(Outcome::Timeout, false, true);
        assert_eq!(r.error.unwrap().details.unwrap()["pids_limit_hit"], true);
        assert!(status(Outcome::Exited { code: 0 }, false, true)
            .error
            .is_none());
    }

    #[test]
    fn exchanges_without_a_report_are_classified_too() {
        let r = classify(&job(), None, &exchange(Ending::Deadline));
        assert_eq!(r.status, ExecStatus::Timeout);
        let r = classify(&job(), None, &exchange(Ending::Flood));
        assert_eq!(
            (r.status, r.stdout_truncated),
            (ExecStatus::OutputLimit, true)
        );
        let r = classify(&job(), None, &exchange(Ending::Closed));
        assert_eq!(r.status, ExecStatus::Killed);
        assert!(r.error.unwrap().message.contains("gone"));
    }

    #[test]
    fn a_kernel_keeps_only_known_outputs_at_artifact_paths() {
        let output = |mime: &str, path: Option<&str>| sandbox_protocol::RichOutput {
            kind: sandbox_protocol::OutputKind::Display,
            mime_type: mime.into(),
            content: path.is_none().then(|| "aGk=".into()),
            base64: true,
            path: path.map(String::from),
        };
        let mut report = RunReport::failed("x");
        report.outcome = Outcome::KernelDied;
        report.state_lost = true;
        report.outputs = vec![
            output("image/png", None),
            output("text/html", Some("artifacts/page.html")),
            output("application/x-evil", None),
            output("text/html", Some("artifacts/../../etc/passwd")),
            output("text/html", Some("code/main.py")),
        ];
        let r = classify(&job(), Some(&report), &exchange(Ending::Reported));
        let kept: Vec<_> = r
            .outputs
            .iter()
            .map(|o| (o.mime_type.as_str(), o.encoding, o.path.as_deref()))
            .collect();
        assert_eq!(
            kept,
            [
                ("image/png", ContentEncoding::Base64, None),
                (
                    "text/html",
                    ContentEncoding::Base64,
                    Some("artifacts/page.html")
                ),
            ]
        );
        assert_eq!((r.status, r.state_lost), (ExecStatus::Killed, true));
    }
}
