//! One execution's exchange with a container's resident supervisor ([`Resident`]): the
//! request written to its exec's stdin, its frames read from the exec stream up to `Done`,
//! and an outer deadline. The wire format and the bounded reading are the node's
//! (`executor_node::exchange`); this is only how the bytes travel in a container.

use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use executor_node::exchange::{request_wire, Ending, Exchange, FrameCollector, OutputStreamer};
use futures::StreamExt;
use sandbox_protocol::RunSpec;
use tokio::io::AsyncWriteExt;

use crate::docker::{DockerError, Sandboxes};
use crate::resident::Resident;

/// A supervisor that reported has read its whole request; past this its stdin writer counts as
/// stuck (the supervisor answered without reading) and the stream is not reused.
const WRITER_GRACE: Duration = Duration::from_secs(1);

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

/// Runs one execution through `container`'s resident supervisor, starting one first when it
/// has none (`resident` is the container's). The supervisor is kept for the next execution
/// only when this one ended cleanly; otherwise the container is suspect anyway.
pub async fn exchange(
    sandboxes: &Sandboxes,
    resident: &mut Option<Box<Resident>>,
    input: ExchangeInput<'_>,
) -> Result<Exchange, DockerError> {
    let Resident {
        exec_id,
        input: mut stdin,
        mut output,
    } = match resident.take() {
        Some(r) => *r,
        None => Resident::start(&sandboxes.docker, input.container, false).await?,
    };
    let wire = request_wire(input.spec, input.archive, input.files)
        .map_err(|e| DockerError::failed("exec", input.container, e.to_string()))?;
    // Written from its own task so a slow reader on the other side never deadlocks us; the
    // stdin comes back for the next run.
    let writer = tokio::spawn(async move {
        let result = async {
            stdin.write_all(&wire).await?;
            stdin.flush().await
        }
        .await;
        (stdin, result)
    });

    let mut collector = FrameCollector::resident(input.spec, input.streamer);
    let deadline = tokio::time::Instant::from_std(input.deadline);
    loop {
        let item = match tokio::time::timeout_at(deadline, output.next()).await {
            Err(_) => {
                collector.stop(Ending::Deadline);
                break;
            }
            Ok(None) => {
                if *collector.ending() == Ending::Reported {
                    // A report but no `Done`: the run is told, the stream is not reusable.
                    collector.note(" (the supervisor stream ended after the report)");
                } else {
                    collector.stop(Ending::Closed);
                }
                break;
            }
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
    if !collector.started()
        && matches!(collector.ending(), Ending::Closed | Ending::StreamFailed(_))
    {
        // Gone before it took the request (its container was killed or stopped while idle):
        // nothing of this run happened, so it may be retried in another container.
        let log = collector.finish().await.supervisor_log;
        let why = format!("its resident supervisor is gone: {}", log.trim());
        return Err(DockerError::failed("exec", input.container, why));
    }
    if collector.at_boundary() {
        match tokio::time::timeout(WRITER_GRACE, writer).await {
            Ok(Ok((input, Ok(())))) => {
                *resident = Some(Box::new(Resident {
                    exec_id,
                    input,
                    output,
                }))
            }
            _ => collector.stop(Ending::Protocol(
                "the supervisor answered before it read its request".into(),
            )),
        }
    } else {
        writer.abort();
        if *collector.ending() == Ending::Closed && !collector.done() {
            // Say how the supervisor ended, so a lost report can be told from a killed process.
            if let Ok(inspect) = sandboxes.docker.inspect_exec(&exec_id).await {
                collector.note(&format!(
                    " (supervisor exit code {:?}, running {:?})",
                    inspect.exit_code, inspect.running
                ));
            }
        }
    }
    Ok(collector.finish().await)
}
