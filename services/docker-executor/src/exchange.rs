//! One execution's single `docker exec`: start the supervisor, send it the request and the
//! workspace archive, read its frames until the report — streaming output chunks as they
//! come — and give up at an outer deadline. The supervisor is not trusted (it runs next to
//! the untrusted code), so every size it sends is bounded here as well. The wire format and
//! the bounded reading ([`request_wire`], [`FrameCollector`]) are shared with the bubblewrap
//! executor, which carries the same frames over a sandbox's pipes.

use std::time::Instant;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::StreamExt;
use messages::exec::{OutputChunk, OutputStream};
use messages::Encoding;
use sandbox_protocol::{self as protocol, FrameDecoder, FrameKind, RunReport, RunSpec};
use tokio::io::AsyncWriteExt;

use crate::docker::{DockerError, Sandboxes, SUPERVISOR_PATH};

/// How much of the supervisor's own stderr is kept for error messages.
const MAX_SUPERVISOR_LOG: usize = 16 * 1024;
/// Tar headers and padding on top of the changed files' content.
const CHANGES_OVERHEAD: u64 = 4 * 1024 * 1024;

/// Why the exchange stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The supervisor sent its report.
    Reported,
    /// The exec stream ended without a report (the supervisor died or was killed).
    Closed,
    /// Reading the exec stream from the Docker daemon failed before the report.
    StreamFailed(String),
    /// The outer deadline passed.
    Deadline,
    /// The supervisor sent more than it may (output or changes past their caps).
    Flood,
    /// Garbage on the wire.
    Protocol(String),
}

impl Ending {
    /// After these the container may still run something of the execution: kill it.
    pub fn container_suspect(&self) -> bool {
        !matches!(self, Ending::Reported)
    }
}

#[derive(Debug)]
pub struct Exchange {
    pub ending: Ending,
    pub report: Option<RunReport>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The tar of created and modified workspace files.
    pub changes: Vec<u8>,
    pub supervisor_log: String,
}

/// Publishes `OutputChunk`s on `sandbox.v1.output.<execution_id>`: in order, `seq` without
/// gaps, text split only on UTF-8 character boundaries, the last chunk with `eof`.
pub struct OutputStreamer {
    client: async_nats::Client,
    subject: String,
    seq: u64,
    /// Bytes of an incomplete UTF-8 character at the end of the last piece, per stream.
    carry: [Vec<u8>; 2],
}

impl OutputStreamer {
    pub fn new(client: async_nats::Client, subject: String) -> Self {
        Self {
            client,
            subject,
            seq: 0,
            carry: [Vec::new(), Vec::new()],
        }
    }

    async fn publish(&mut self, stream: OutputStream, data: String, eof: bool) {
        let chunk = OutputChunk {
            seq: self.seq,
            stream,
            data,
            eof,
        };
        self.seq += 1;
        let Ok(payload) = Encoding::Json.encode(&chunk) else {
            return;
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(messages::codec::CONTENT_TYPE, Encoding::Json.content_type());
        if let Err(e) = self
            .client
            .publish_with_headers(self.subject.clone(), headers, payload.into())
            .await
        {
            tracing::debug!(error = %e, "could not publish an output chunk");
        }
    }

    pub async fn chunk(&mut self, stream: OutputStream, bytes: &[u8]) {
        let carry = &mut self.carry[stream as usize];
        carry.extend_from_slice(bytes);
        let text = take_utf8(carry);
        if !text.is_empty() {
            self.publish(stream, text, false).await;
        }
    }

    /// Sends what is left (lossily) and the `eof` chunk.
    pub async fn finish(&mut self) {
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let rest = std::mem::take(&mut self.carry[stream as usize]);
            if !rest.is_empty() {
                self.publish(stream, String::from_utf8_lossy(&rest).into_owned(), false)
                    .await;
            }
        }
        self.publish(OutputStream::Stdout, String::new(), true)
            .await;
        let _ = self.client.flush().await;
    }
}

/// Takes the longest decodable prefix of `buf` (invalid bytes become U+FFFD), leaving only an
/// incomplete trailing character behind.
fn take_utf8(buf: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut start = 0;
    loop {
        match std::str::from_utf8(&buf[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = buf.len();
                break;
            }
            Err(e) => {
                let valid = start + e.valid_up_to();
                out.push_str(std::str::from_utf8(&buf[start..valid]).expect("validated"));
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        start = valid + n;
                    }
                    None => {
                        start = valid;
                        break;
                    }
                }
            }
        }
    }
    buf.drain(..start);
    out
}

/// Everything one exchange needs.
pub struct ExchangeInput<'a> {
    pub container: &'a str,
    pub spec: &'a RunSpec,
    /// The workspace snapshot (tar).
    pub archive: &'a [u8],
    /// The request's files (tar).
    pub files: &'a [u8],
    pub deadline: Instant,
    pub streamer: Option<&'a mut OutputStreamer>,
}

/// What the executor sends the supervisor on its stdin: the request, the workspace archive,
/// the request's files and the end marker. The same for every backend. Fails when the request
/// itself does not fit in one frame.
pub fn request_wire(spec: &RunSpec, archive: &[u8], files: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut wire = Vec::with_capacity(archive.len() + files.len() + 4096);
    let request = serde_json::to_vec(spec).expect("RunSpec serialises");
    protocol::write_frame(&mut wire, FrameKind::Request, &request)?;
    protocol::write_chunked(&mut wire, FrameKind::Archive, archive).expect("vec write");
    protocol::write_chunked(&mut wire, FrameKind::Files, files).expect("vec write");
    protocol::write_frame(&mut wire, FrameKind::End, &[]).expect("vec write");
    Ok(wire)
}

/// Reads the supervisor's side of one exchange, whatever carries it (a `docker exec` stream,
/// a bubblewrap sandbox's pipes): decodes frames, bounds output and changes by the spec's
/// caps (the supervisor is not trusted), streams output chunks, and keeps the supervisor's
/// own log for error messages.
pub struct FrameCollector<'a> {
    decoder: FrameDecoder,
    ex: Exchange,
    max_output: u64,
    max_changes: u64,
    streamer: Option<&'a mut OutputStreamer>,
}

impl<'a> FrameCollector<'a> {
    pub fn new(spec: &RunSpec, streamer: Option<&'a mut OutputStreamer>) -> Self {
        Self {
            decoder: FrameDecoder::default(),
            ex: Exchange {
                ending: Ending::Closed,
                report: None,
                stdout: Vec::new(),
                stderr: Vec::new(),
                changes: Vec::new(),
                supervisor_log: String::new(),
            },
            max_output: spec.max_output_bytes,
            max_changes: spec.max_changes_bytes + CHANGES_OVERHEAD,
            streamer,
        }
    }

    /// Takes bytes of the supervisor's stdout. `true`: the exchange is over (a report, a
    /// flood or garbage); nothing more is read.
    pub async fn push(&mut self, bytes: &[u8]) -> bool {
        self.decoder.push(bytes);
        loop {
            let (kind, payload) = match self.decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return false,
                Err(e) => {
                    self.ex.ending = Ending::Protocol(e.to_string());
                    return true;
                }
            };
            let ex = &mut self.ex;
            match kind {
                FrameKind::Stdout | FrameKind::Stderr => {
                    let total = (ex.stdout.len() + ex.stderr.len() + payload.len()) as u64;
                    if total > self.max_output {
                        ex.ending = Ending::Flood;
                        return true;
                    }
                    let (buf, stream) = if kind == FrameKind::Stdout {
                        (&mut ex.stdout, OutputStream::Stdout)
                    } else {
                        (&mut ex.stderr, OutputStream::Stderr)
                    };
                    buf.extend_from_slice(&payload);
                    if let Some(s) = self.streamer.as_deref_mut() {
                        s.chunk(stream, &payload).await;
                    }
                }
                FrameKind::Changes => {
                    if (ex.changes.len() + payload.len()) as u64 > self.max_changes {
                        ex.ending = Ending::Flood;
                        return true;
                    }
                    ex.changes.extend_from_slice(&payload);
                }
                FrameKind::Report => {
                    match serde_json::from_slice::<RunReport>(&payload) {
                        Ok(report) => {
                            ex.report = Some(report);
                            ex.ending = Ending::Reported;
                        }
                        Err(e) => ex.ending = Ending::Protocol(format!("malformed report: {e}")),
                    }
                    return true;
                }
                other => {
                    ex.ending = Ending::Protocol(format!("unexpected {other:?} frame"));
                    return true;
                }
            }
        }
    }

    /// Keeps (the start of) what the supervisor wrote to its stderr.
    pub fn log(&mut self, bytes: &[u8]) {
        let log = &mut self.ex.supervisor_log;
        let room = MAX_SUPERVISOR_LOG.saturating_sub(log.len());
        log.push_str(&String::from_utf8_lossy(&bytes[..bytes.len().min(room)]));
    }

    /// Ends the exchange without a report: `ending` says why.
    pub fn stop(&mut self, ending: Ending) {
        self.ex.ending = ending;
    }

    pub fn ending(&self) -> &Ending {
        &self.ex.ending
    }

    /// Appends a note on how the supervisor ended to its log.
    pub fn note(&mut self, note: &str) {
        self.ex.supervisor_log.push_str(note);
    }

    /// Ends the output stream (readers see `eof`) and hands over what was collected.
    pub async fn finish(mut self) -> Exchange {
        if let Some(s) = self.streamer.take() {
            s.finish().await;
        }
        self.ex
    }
}

/// Runs the supervisor once in `container`.
pub async fn exchange(
    sandboxes: &Sandboxes,
    input: ExchangeInput<'_>,
) -> Result<Exchange, DockerError> {
    let docker = &sandboxes.docker;
    let options = CreateExecOptions {
        cmd: Some(vec![SUPERVISOR_PATH, "run"]),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        ..Default::default()
    };
    let exec = docker
        .create_exec(input.container, options)
        .await
        .map_err(|e| DockerError::api("exec", input.container, e))?;
    let started = docker
        .start_exec(&exec.id, None)
        .await
        .map_err(|e| DockerError::api("exec start", input.container, e))?;
    let StartExecResults::Attached {
        mut output,
        input: mut stdin,
    } = started
    else {
        return Err(DockerError::failed(
            "exec start",
            input.container,
            "not attached",
        ));
    };

    let wire = request_wire(input.spec, input.archive, input.files)
        .map_err(|e| DockerError::failed("exec", input.container, e.to_string()))?;
    // Written from its own task so a slow reader on the other side never deadlocks us.
    let writer = tokio::spawn(async move {
        let result = stdin.write_all(&wire).await;
        let _ = stdin.shutdown().await;
        result
    });

    let mut collector = FrameCollector::new(input.spec, input.streamer);
    let deadline = tokio::time::Instant::from_std(input.deadline);
    loop {
        let item = match tokio::time::timeout_at(deadline, output.next()).await {
            Err(_) => {
                collector.stop(Ending::Deadline);
                break;
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                tracing::warn!(container = input.container, error = %e, "exec stream failed");
                collector.stop(Ending::StreamFailed(e.to_string()));
                break;
            }
            Ok(Some(Ok(item))) => item,
        };
        match item {
            LogOutput::StdOut { message } if collector.push(&message).await => break,
            LogOutput::StdErr { message } => collector.log(&message),
            _ => {}
        }
    }
    writer.abort();
    if *collector.ending() == Ending::Closed {
        // Say how the supervisor ended, so a lost report can be told from a killed process.
        if let Ok(inspect) = docker.inspect_exec(&exec.id).await {
            collector.note(&format!(
                " (supervisor exit code {:?}, running {:?})",
                inspect.exit_code, inspect.running
            ));
        }
    }
    Ok(collector.finish().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_split_only_on_character_boundaries() {
        let text = "héllo → 世界";
        let bytes = text.as_bytes();
        for split in 1..bytes.len() {
            let mut carry = Vec::new();
            let mut out = String::new();
            for piece in bytes.chunks(split) {
                carry.extend_from_slice(piece);
                out.push_str(&take_utf8(&mut carry));
            }
            assert!(carry.is_empty());
            assert_eq!(out, text, "split {split}");
        }
        let mut bad = vec![b'a', 0xff, b'b'];
        assert_eq!(take_utf8(&mut bad), "a\u{FFFD}b");
    }
}
