//! One end of a preview port's byte tunnel over NATS ([`messages::ports`]): bytes read from a
//! local stream go out as `data` frames, no more than the other end granted; `data` frames
//! that arrive are written to the local stream and only then granted back as `credit`, so a
//! slow reader on either side stops the writer on the other instead of filling memory. Both
//! ends run this same [`pump`]: the gateway (its side of an HTTP connection) and the executor
//! node (the host's side of the container's ports socket).
//!
//! ```text
//! pump ── dispatcher (this future): frames in → credit, data to the writer, eof, close;
//! │                                  keepalive, idle close, stop
//! ├── reader task: local stream → data frames (waits for credit), eof at its end
//! └── writer task: data → local stream, then credit back; eof → shutdown
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::{HeaderMap, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use messages::ports::{
    FrameError, Inbound, TunnelFrame, TUNNEL_CHUNK, TUNNEL_CREDIT_HEADER, TUNNEL_IDLE_MS,
    TUNNEL_KIND_HEADER, TUNNEL_SEQ_HEADER, TUNNEL_WINDOW,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Mutex, Notify};
use tokio_util::sync::CancellationToken;

/// Why a tunnel ended other than by both sides closing their direction.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The other end closed the tunnel, saying why.
    #[error("the other end closed the tunnel: {0}")]
    Closed(String),
    #[error("nothing heard from the other end for {0:?}")]
    Idle(Duration),
    #[error("the tunnel was stopped: {0}")]
    Stopped(&'static str),
    #[error("sending on the tunnel")]
    Publish(#[source] async_nats::PublishError),
    #[error("the local stream")]
    Io(#[source] std::io::Error),
}

/// How long a tunnel may hear nothing from the other end.
pub fn idle_limit() -> Duration {
    Duration::from_millis(TUNNEL_IDLE_MS)
}

/// The sending half: frames numbered in order, whichever task sends them.
struct Outbox {
    nats: async_nats::Client,
    subject: String,
    /// The next sequence number and when anything was last sent (for keepalives); one lock,
    /// held across the publish, so numbers go out in order.
    state: Mutex<(u64, Instant)>,
}

impl Outbox {
    async fn send(&self, frame: TunnelFrame) -> Result<(), TunnelError> {
        let mut state = self.state.lock().await;
        let mut headers = HeaderMap::new();
        headers.insert(TUNNEL_KIND_HEADER, frame.kind());
        headers.insert(TUNNEL_SEQ_HEADER, state.0.to_string().as_str());
        let payload = match frame {
            TunnelFrame::Data(bytes) => Bytes::from(bytes),
            TunnelFrame::Credit(n) => {
                headers.insert(TUNNEL_CREDIT_HEADER, n.to_string().as_str());
                Bytes::new()
            }
            TunnelFrame::Eof => Bytes::new(),
            TunnelFrame::Close(why) => Bytes::from(why),
        };
        self.nats
            .publish_with_headers(self.subject.clone(), headers, payload)
            .await
            .map_err(TunnelError::Publish)?;
        *state = (state.0 + 1, Instant::now());
        Ok(())
    }

    async fn quiet_for(&self) -> Duration {
        self.state.lock().await.1.elapsed()
    }
}

/// Bytes this end may still send.
#[derive(Default)]
struct Credit {
    bytes: std::sync::Mutex<u64>,
    more: Notify,
}

impl Credit {
    fn add(&self, n: u64) {
        *self.bytes.lock().unwrap_or_else(|e| e.into_inner()) += n;
        self.more.notify_one();
    }

    /// Waits for credit and takes up to `max` bytes of it.
    async fn take(&self, max: usize) -> usize {
        loop {
            let notified = self.more.notified();
            {
                let mut bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
                if *bytes > 0 {
                    let n = (*bytes).min(max as u64);
                    *bytes -= n;
                    return n as usize;
                }
            }
            notified.await;
        }
    }
}

/// Runs one end of a tunnel until both directions closed, the other end closed it, it idled
/// out, an error, or `stop`; then the other end is told (a `close` frame, with why), and the
/// local stream is dropped. `inbox` receives what the other end sends to this one; frames go
/// out on `send_to`. Both ends start out granting each other [`TUNNEL_WINDOW`] bytes (each
/// subscribed before the other could send).
pub async fn pump<S>(
    stream: S,
    nats: async_nats::Client,
    send_to: String,
    inbox: Subscriber,
    stop: CancellationToken,
) -> Result<(), TunnelError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let out = Arc::new(Outbox {
        nats,
        subject: send_to,
        state: Mutex::new((0, Instant::now())),
    });
    let credit = Arc::new(Credit::default());
    credit.add(TUNNEL_WINDOW);
    let (read_half, write_half) = tokio::io::split(stream);
    let (to_writer, from_dispatcher) = mpsc::unbounded_channel();
    let mut reader = tokio::spawn(read_local(read_half, out.clone(), credit.clone()));
    let granted = Arc::new(AtomicU64::new(0));
    let mut writer = tokio::spawn(write_local(
        write_half,
        from_dispatcher,
        out.clone(),
        granted.clone(),
    ));
    let tasks = Tasks {
        reader: &mut reader,
        writer: &mut writer,
        granted: &granted,
    };
    let ended = dispatch(inbox, &out, &credit, to_writer, tasks, &stop).await;
    reader.abort();
    writer.abort();
    match &ended {
        Err(TunnelError::Closed(_)) => {}
        Ok(()) => {
            let _ = out.send(TunnelFrame::Close(String::new())).await;
        }
        Err(e) => {
            let _ = out.send(TunnelFrame::Close(e.to_string())).await;
        }
    }
    ended
}

type Task = tokio::task::JoinHandle<Result<(), TunnelError>>;

fn joined(
    result: Result<Result<(), TunnelError>, tokio::task::JoinError>,
) -> Result<(), TunnelError> {
    result.unwrap_or(Err(TunnelError::Stopped("a tunnel task panicked")))
}

/// The dispatcher's view of the two tasks.
struct Tasks<'a> {
    reader: &'a mut Task,
    writer: &'a mut Task,
    /// Bytes the writer granted back since the dispatcher last looked (it adds them before it
    /// sends the credit, so the other end cannot use a grant the dispatcher does not know).
    granted: &'a AtomicU64,
}

async fn dispatch(
    mut inbox: Subscriber,
    out: &Outbox,
    credit: &Credit,
    to_writer: mpsc::UnboundedSender<Option<Vec<u8>>>,
    tasks: Tasks<'_>,
    stop: &CancellationToken,
) -> Result<(), TunnelError> {
    let Tasks {
        reader,
        writer,
        granted,
    } = tasks;
    let idle = idle_limit();
    let mut inbound = Inbound::new(TUNNEL_WINDOW);
    let mut keepalive = tokio::time::interval(idle / 3);
    let (mut read_done, mut write_done) = (false, false);
    let mut heard = tokio::time::Instant::now();
    loop {
        if read_done && write_done {
            return Ok(());
        }
        tokio::select! {
            _ = stop.cancelled() => return Err(TunnelError::Stopped("its sandbox is gone")),
            r = &mut *reader, if !read_done => {
                joined(r)?;
                read_done = true;
            }
            w = &mut *writer, if !write_done => {
                joined(w)?;
                write_done = true;
            }
            _ = keepalive.tick() => {
                if heard.elapsed() >= idle {
                    return Err(TunnelError::Idle(idle));
                }
                if out.quiet_for().await >= idle / 3 {
                    out.send(TunnelFrame::Credit(0)).await?;
                }
            }
            msg = inbox.next() => {
                let Some(msg) = msg else {
                    return Err(TunnelError::Stopped("the subscription ended"));
                };
                heard = tokio::time::Instant::now();
                let header = |name| msg.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str());
                let frame = TunnelFrame::parse(
                    header(TUNNEL_KIND_HEADER).unwrap_or(""),
                    header(TUNNEL_CREDIT_HEADER),
                    &msg.payload,
                )?;
                inbound.grant(granted.swap(0, Ordering::AcqRel));
                inbound.accept(header(TUNNEL_SEQ_HEADER), &frame)?;
                match frame {
                    TunnelFrame::Data(bytes) => {
                        let _ = to_writer.send(Some(bytes));
                    }
                    TunnelFrame::Credit(n) => credit.add(n),
                    TunnelFrame::Eof => {
                        let _ = to_writer.send(None);
                    }
                    TunnelFrame::Close(why) if why.is_empty() => return Ok(()),
                    TunnelFrame::Close(why) => return Err(TunnelError::Closed(why)),
                }
            }
        }
    }
}

async fn read_local<R: AsyncRead>(
    local: R,
    out: Arc<Outbox>,
    credit: Arc<Credit>,
) -> Result<(), TunnelError> {
    let mut local = std::pin::pin!(local);
    let mut buf = vec![0u8; TUNNEL_CHUNK];
    loop {
        let allowed = credit.take(TUNNEL_CHUNK).await;
        let n = local
            .read(&mut buf[..allowed])
            .await
            .map_err(TunnelError::Io)?;
        credit.add((allowed - n) as u64);
        if n == 0 {
            return out.send(TunnelFrame::Eof).await;
        }
        out.send(TunnelFrame::Data(buf[..n].to_vec())).await?;
    }
}

async fn write_local<W: AsyncWrite>(
    local: W,
    mut frames: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    out: Arc<Outbox>,
    granted: Arc<AtomicU64>,
) -> Result<(), TunnelError> {
    let mut local = std::pin::pin!(local);
    while let Some(frame) = frames.recv().await {
        let Some(bytes) = frame else {
            let _ = local.shutdown().await;
            return Ok(());
        };
        local.write_all(&bytes).await.map_err(TunnelError::Io)?;
        granted.fetch_add(bytes.len() as u64, Ordering::AcqRel);
        out.send(TunnelFrame::Credit(bytes.len() as u64)).await?;
    }
    Ok(())
}
