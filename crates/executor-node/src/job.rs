//! An accepted execution as every backend sees it: the [`Job`] (the run and its decided
//! limits), the [`Admitted`] job that answers its caller exactly once and gives its run slot
//! back, and the supervisor's request for it ([`run_spec`], [`request_files`]): the same
//! program, environment and limits whichever sandbox runs it.

use std::sync::Arc;
use std::time::Instant;

use messages::exec::{EffectiveLimits, Language};
use messages::executor::ExecutorRun;
use messages::template::TemplateRan;
use messages::ErrorKind;
use sandbox_protocol::{KernelLanguage, RunSpec, PROTOCOL_VERSION};

use crate::config::NodeConfig;
use crate::error::ExecutorError;
use crate::results::{Answer, Reply, ResultStore};
use crate::slot::RunSlot;

/// Where the sandbox image installs the supervisor, and the workspace inside every sandbox
/// (also `HOME`): part of the protocol, since filesystem policies are checked against them.
pub use messages::filesystem::{SUPERVISOR_PATH, WORKSPACE_DIR};

/// The directory of the code's name in the argv (`RunSpec::code_path`): the supervisor puts
/// the path of the code's sealed descriptor in its place, and writes no file there.
const CODE_DIR: &str = "/tmp/.sandmesh";

/// An accepted run with its limits decided.
#[derive(Debug)]
pub struct Job {
    pub run: ExecutorRun,
    pub limits: EffectiveLimits,
    pub accepted: Instant,
    /// Already retried once after an unusable container.
    pub retried: bool,
}

/// A job with the caller waiting for it and its run slot: answering consumes it (and gives
/// the slot back), and answers alike every caller that attached to the run meanwhile (the
/// node's [`ResultStore`] keeps the answer for callers whose reply was lost). Dropping it
/// unanswered answers them all `unavailable`: nothing is kept, so a retry runs it.
pub struct Admitted {
    pub job: Job,
    reply: Option<Reply>,
    slot: Option<RunSlot>,
    results: Arc<ResultStore>,
    /// The template and image it runs in, once resolved; its result says so.
    pub ran: Option<TemplateRan>,
}

impl Admitted {
    /// `results` has been told the run [`ResultStore::started`].
    pub fn new(job: Job, reply: Reply, slot: RunSlot, results: Arc<ResultStore>) -> Self {
        Self {
            job,
            reply: Some(reply),
            slot: Some(slot),
            results,
            ran: None,
        }
    }

    pub fn answer(mut self, mut result: Answer) {
        if let Ok(r) = &mut result {
            r.template = self.ran.take();
        }
        self.settle(result);
    }

    fn settle(&mut self, result: Answer) {
        let Some(reply) = self.reply.take() else {
            return;
        };
        for attached in self.results.finished(&self.job.run, &result) {
            let _ = attached.send(result.clone());
        }
        let _ = reply.send(result);
        if let Some(slot) = self.slot.take() {
            slot.finished();
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        // Unanswered (a task that panicked, an actor that stopped): what the kit answers for
        // a dropped reply, to every caller, and not kept.
        self.settle(Err(ExecutorError::Unanswered));
    }
}

fn program(language: Language) -> (Vec<String>, String) {
    let (file, argv): (&str, &[&str]) = match language {
        Language::Python => ("main.py", &["python3", "-u"]),
        // Node would resolve the code's descriptor path (`/proc/self/fd/N`, see the supervisor)
        // to the memfd's name, which is no file.
        Language::Javascript => ("main.js", &["node", "--preserve-symlinks-main"]),
        Language::Shell => ("main.sh", &["bash"]),
    };
    let path = format!("{CODE_DIR}/{file}");
    let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    argv.push(path.clone());
    (argv, path)
}

/// The most output a result can carry over `client`: the server's max payload less room for
/// the rest of the result.
pub fn output_budget(client: &async_nats::Client) -> u64 {
    let max_payload = client.server_info().max_payload as u64;
    max_payload.saturating_sub(64 * 1024).max(64 * 1024)
}

/// The supervisor's request for `job`, the same for every backend: the program for its
/// language, a clean environment (the request's variables on top), the node's limits, and
/// room for changed files only when `keeps_changes` (a workspace takes them).
/// The environment every program in a sandbox starts from (a run's, a background
/// process's); the caller's variables are added over it.
pub fn base_env() -> Vec<(String, String)> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", WORKSPACE_DIR),
        ("LANG", "C.UTF-8"),
        ("TMPDIR", "/tmp"),
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        // The script is read from a descriptor; modules are imported from the workspace.
        ("PYTHONPATH", WORKSPACE_DIR),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

pub fn run_spec(job: &Job, config: &NodeConfig, keeps_changes: bool) -> RunSpec {
    let req = job.run.request();
    let (argv, code_path) = program(req.language);
    let mut env = base_env();
    for (k, v) in &req.env {
        env.retain(|(name, _)| name != k);
        env.push((k.clone(), v.clone()));
    }
    RunSpec {
        version: PROTOCOL_VERSION,
        argv,
        code_path,
        code: req.code.clone(),
        stdin: req.stdin.clone(),
        env,
        workspace: WORKSPACE_DIR.into(),
        timeout_ms: job.limits.timeout_ms,
        max_output_bytes: job.limits.max_output_bytes,
        nofile: config.nofile,
        fsize_bytes: config.fsize_mb << 20,
        max_changes_bytes: if keeps_changes {
            config.workspace_mb << 20
        } else {
            0
        },
        // Set by the backend whose container has an egress socket.
        egress_socket: None,
        kernel: match (req.kernel, req.language) {
            (false, _) => None,
            (true, Language::Python) => Some(KernelLanguage::Python),
            (true, Language::Javascript) => Some(KernelLanguage::Javascript),
            // Refused on admission: a shell has no kernel.
            (true, Language::Shell) => None,
        },
    }
}

/// Why the request's files could not be packed for the supervisor: its result's error.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// Content that does not decode in the encoding it names.
    #[error("{path}: {reason}")]
    Content { path: String, reason: String },
    /// A file tar refuses (a path it cannot store).
    #[error("{path}: {source}")]
    Append {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("packing the request's files: {0}")]
    Finish(#[source] std::io::Error),
}

impl FilesError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            FilesError::Content { .. } | FilesError::Append { .. } => ErrorKind::BadRequest,
            FilesError::Finish(_) => ErrorKind::Internal,
        }
    }
}

/// The request's files as a tar (paths were validated on admission).
pub fn request_files(job: &Job) -> Result<Vec<u8>, FilesError> {
    let files = &job.run.request().files;
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let mut b = tar::Builder::new(Vec::new());
    for f in files {
        let bytes = f.bytes().map_err(|reason| FilesError::Content {
            path: f.path.clone(),
            reason,
        })?;
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, &f.path, bytes.as_slice())
            .map_err(|source| FilesError::Append {
                path: f.path.clone(),
                source,
            })?;
    }
    b.into_inner().map_err(FilesError::Finish)
}

#[cfg(test)]
mod tests {
    use messages::exec::{validate_exec, ContentEncoding, ExecRequest, FileSpec};
    use messages::executor::RunKind;
    use messages::validate::Ceilings;

    use super::*;

    /// A job with `files`, which admission has not seen (it would refuse undecodable ones).
    fn job_with(files: Vec<FileSpec>) -> Job {
        let mut request = ExecRequest {
            language: Language::Python,
            code: "x".into(),
            ..Default::default()
        };
        let limits = validate_exec(&request, &Ceilings::default()).unwrap();
        request.files = files;
        Job {
            limits,
            run: ExecutorRun::new("e1".into(), request, RunKind::Pooled).unwrap(),
            accepted: Instant::now(),
            retried: false,
        }
    }

    #[test]
    fn files_that_cannot_be_packed_are_the_callers_fault_unless_tar_fails() {
        let undecodable = FileSpec {
            path: "data.bin".into(),
            content: "not base64!".into(),
            encoding: ContentEncoding::Base64,
        };
        let e = request_files(&job_with(vec![undecodable])).unwrap_err();
        assert!(matches!(e, FilesError::Content { ref path, .. } if path == "data.bin"));
        assert_eq!(e.kind(), ErrorKind::BadRequest, "{e}");
        let refused = FilesError::Append {
            path: "a".into(),
            source: std::io::Error::other("path too long"),
        };
        assert_eq!(refused.kind(), ErrorKind::BadRequest);
        let finish = FilesError::Finish(std::io::Error::other("disk"));
        assert_eq!(finish.kind(), ErrorKind::Internal);
    }
}
