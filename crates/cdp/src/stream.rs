//! Where a DevTools endpoint is: `host:port` over TCP, or `unix:<path>`, a Unix socket (a
//! browser in a container with no network, reached through a directory bind-mounted into it).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// The prefix of a Unix socket endpoint.
pub const UNIX_PREFIX: &str = "unix:";

/// A connection to a DevTools endpoint.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Connects to `addr`: `unix:<path>` or `host:port`.
pub async fn dial(addr: &str) -> std::io::Result<Stream> {
    match addr.strip_prefix(UNIX_PREFIX) {
        Some(path) => UnixStream::connect(path).await.map(Stream::Unix),
        None => TcpStream::connect(addr).await.map(Stream::Tcp),
    }
}

/// The `Host` requests to `addr` carry: the address itself, or `localhost` for a socket
/// (Chromium's Host check accepts IP addresses and `localhost` only).
pub fn host_of(addr: &str) -> &str {
    if addr.starts_with(UNIX_PREFIX) {
        "localhost"
    } else {
        addr
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
