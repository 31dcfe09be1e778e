//! The executor's half of the supervisor protocol, whatever carries it: the request on the
//! supervisor's stdin ([`request_wire`]), its frames read back until the report — output
//! chunks streamed as they come ([`OutputStreamer`]) — with every size bounded, since the
//! supervisor runs next to the untrusted code and is not trusted ([`FrameCollector`]). A
//! backend only moves bytes: the Docker backend over a container's resident supervisor's
//! exec stream, the bwrap backend over a fresh sandbox's pipes.

use messages::exec::{OutputChunk, OutputStream};
use messages::Encoding;
use sandbox_protocol::{self as protocol, FrameDecoder, FrameKind, RunReport, RunSpec};

/// How much of the supervisor's own stderr is kept for error messages.
const MAX_SUPERVISOR_LOG: usize = 16 * 1024;

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
    /// A resident supervisor's run ends with `Done` (after the report, or in place of a lost
    /// one), not with the report.
    resident: bool,
    started: bool,
    done: bool,
}

impl<'a> FrameCollector<'a> {
    /// For a supervisor process that serves this one run.
    pub fn new(spec: &RunSpec, streamer: Option<&'a mut OutputStreamer>) -> Self {
        Self::with_end(spec, streamer, false)
    }

    /// For a run of a resident supervisor: read up to its `Done`.
    pub fn resident(spec: &RunSpec, streamer: Option<&'a mut OutputStreamer>) -> Self {
        Self::with_end(spec, streamer, true)
    }

    fn with_end(spec: &RunSpec, streamer: Option<&'a mut OutputStreamer>, resident: bool) -> Self {
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
            max_changes: spec.max_changes_bytes + protocol::CHANGES_ARCHIVE_OVERHEAD,
            streamer,
            resident,
            started: false,
            done: false,
        }
    }

    /// Takes bytes of the supervisor's stdout. `true`: the exchange is over (the report, or a
    /// resident supervisor's `Done`; a flood or garbage); nothing more is read.
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
            if ex.report.is_some() && kind != FrameKind::Done {
                ex.ending = Ending::Protocol(format!("{kind:?} frame after the report"));
                return true;
            }
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
                FrameKind::Report => match serde_json::from_slice::<RunReport>(&payload) {
                    Ok(report) => {
                        ex.report = Some(report);
                        ex.ending = Ending::Reported;
                        if !self.resident {
                            return true;
                        }
                    }
                    Err(e) => {
                        ex.ending = Ending::Protocol(format!("malformed report: {e}"));
                        return true;
                    }
                },
                FrameKind::Started if self.resident && !self.started => self.started = true,
                FrameKind::Done if self.resident => {
                    // Its run process ended; without a report it died (or was killed) first.
                    self.done = true;
                    if ex.report.is_none() {
                        let status = String::from_utf8_lossy(&payload);
                        ex.supervisor_log
                            .push_str(&format!(" (run process: {status})"));
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

    /// Whether the supervisor said it started the run: before that, nothing of it happened.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Whether a resident supervisor said `Done` (the run process ended).
    pub fn done(&self) -> bool {
        self.done
    }

    pub fn ending(&self) -> &Ending {
        &self.ex.ending
    }

    /// A resident supervisor's run ended cleanly: reported, `Done`, and nothing left over, so
    /// its stream is at a run boundary and may carry the next run.
    pub fn at_boundary(&self) -> bool {
        self.done && self.ex.ending == Ending::Reported && self.decoder.is_empty()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RunSpec {
        RunSpec {
            version: protocol::PROTOCOL_VERSION,
            argv: vec!["true".into()],
            code_path: "/tmp/.sandmesh/main.sh".into(),
            code: String::new(),
            stdin: None,
            env: Vec::new(),
            workspace: "/workspace".into(),
            timeout_ms: 1000,
            max_output_bytes: 1024,
            nofile: 64,
            fsize_bytes: 1024,
            max_changes_bytes: 0,
            egress_socket: None,
            kernel: None,
        }
    }

    fn wire(frames: &[(FrameKind, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (kind, payload) in frames {
            out.extend(protocol::encode_frame(*kind, payload));
        }
        out
    }

    fn report() -> Vec<u8> {
        let mut r = RunReport::failed("unused");
        r.outcome = protocol::Outcome::Exited { code: 0 };
        serde_json::to_vec(&r).unwrap()
    }

    #[tokio::test]
    async fn a_resident_run_ends_at_done_and_a_single_run_at_its_report() {
        let spec = spec();
        let mut c = FrameCollector::resident(&spec, None);
        let run = wire(&[
            (FrameKind::Started, b""),
            (FrameKind::Stdout, b"hi"),
            (FrameKind::Report, &report()),
        ]);
        assert!(
            !c.push(&run).await,
            "the report is not the end of a resident run"
        );
        assert!(c.push(&wire(&[(FrameKind::Done, b"exit status: 0")])).await);
        assert!(c.at_boundary());
        let ex = c.finish().await;
        assert_eq!((ex.ending, ex.stdout), (Ending::Reported, b"hi".to_vec()));

        let mut c = FrameCollector::new(&spec, None);
        assert!(c.push(&wire(&[(FrameKind::Report, &report())])).await);
        assert_eq!(*c.ending(), Ending::Reported);
    }

    #[tokio::test]
    async fn a_resident_stream_is_reused_only_at_a_clean_boundary() {
        let spec = spec();
        // The run process died before reporting: `Done` says how.
        let mut c = FrameCollector::resident(&spec, None);
        let died = wire(&[
            (FrameKind::Started, b""),
            (FrameKind::Done, b"signal: 9 (SIGKILL)"),
        ]);
        assert!(c.push(&died).await);
        assert!(c.started() && !c.at_boundary());
        let ex = c.finish().await;
        assert_eq!(ex.ending, Ending::Closed);
        assert!(ex.supervisor_log.contains("signal: 9"), "{ex:?}");

        // Output after the report is a lie about the run.
        let mut c = FrameCollector::resident(&spec, None);
        let after = wire(&[(FrameKind::Report, &report()), (FrameKind::Stdout, b"x")]);
        assert!(c.push(&after).await);
        assert!(
            matches!(c.ending(), Ending::Protocol(_)),
            "{:?}",
            c.ending()
        );

        // Bytes past `Done` would be read as the next run's.
        let mut c = FrameCollector::resident(&spec, None);
        let extra = wire(&[(FrameKind::Report, &report()), (FrameKind::Done, b"")]);
        assert!(c.push(&[extra, vec![b'O']].concat()).await);
        assert!(!c.at_boundary());

        // `Started` once per run, first.
        let mut c = FrameCollector::resident(&spec, None);
        assert!(
            c.push(&wire(&[
                (FrameKind::Started, b""),
                (FrameKind::Started, b"")
            ]))
            .await
        );
        assert!(
            matches!(c.ending(), Ending::Protocol(_)),
            "{:?}",
            c.ending()
        );

        // A single-run supervisor never says `Done`.
        let mut c = FrameCollector::new(&spec, None);
        assert!(c.push(&wire(&[(FrameKind::Done, b"")])).await);
        assert!(
            matches!(c.ending(), Ending::Protocol(_)),
            "{:?}",
            c.ending()
        );
    }

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
