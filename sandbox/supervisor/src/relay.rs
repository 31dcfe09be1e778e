//! The egress relay: while a run with a network policy lasts, `127.0.0.1:3128` inside the
//! container is a plain byte relay to the container's egress socket (bind-mounted from the
//! host), and the program's proxy variables point there. A background process's host relays
//! a port of its own (any free one) to the process's own socket, for the process's life. The container itself has no network
//! interface but loopback, so a program that ignores the variables reaches nothing.
//!
//! Threads, not an async runtime: the supervisor stays std + nix. Each connection costs two
//! threads (one per direction); they end when either side closes, and all of them end with
//! the supervisor process after the report.

use std::io;
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread;

/// The variables that send HTTP(S) clients through the relay: both spellings, since tools
/// disagree (curl reads lowercase `http_proxy` only; Python and pip read either). Local
/// addresses bypass it, so a program's own loopback servers keep working.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let no_proxy = "localhost,127.0.0.1".to_string();
    let mut env = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", &url),
        ("HTTPS_PROXY", &url),
        ("ALL_PROXY", &url),
        ("NO_PROXY", &no_proxy),
    ] {
        env.push((name.to_string(), value.clone()));
        env.push((name.to_ascii_lowercase(), value.clone()));
    }
    env
}

/// Listens on `port` (0: any free one) and serves every connection in the background; returns
/// the port. Bound before the program starts, so the program cannot take the port first.
///
/// With `SO_REUSEPORT`: the next run binds the run port while the last run's connections may
/// still linger in the kernel. Only a process of the same uid can share the port — the
/// session's own, which has its policy anyway.
pub fn start(socket: &str, port: u16) -> io::Result<u16> {
    use rustix::net::{bind, listen, socket_with, sockopt, AddressFamily, SocketFlags, SocketType};
    // Close-on-exec: the program must not inherit the listener.
    let fd = socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    sockopt::set_socket_reuseport(&fd, true)?;
    bind(&fd, &std::net::SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))?;
    listen(&fd, 128)?;
    let listener = TcpListener::from(fd);
    let port = listener.local_addr()?.port();
    let socket = PathBuf::from(socket);
    thread::Builder::new()
        .name("egress-accept".into())
        .spawn(move || {
            for client in listener.incoming().flatten() {
                let socket = socket.clone();
                // A thread that cannot start (pids limit) drops the connection: fail closed.
                let _ = thread::Builder::new()
                    .name("egress-relay".into())
                    .spawn(move || relay(client, &socket));
            }
        })?;
    Ok(port)
}

/// Relays one client of the egress port to the proxy's socket.
fn relay(client: TcpStream, socket: &Path) {
    let Ok(upstream) = UnixStream::connect(socket) else {
        return; // the proxy is gone: the client sees its connection closed
    };
    splice(client, upstream);
}

/// Copies bytes both ways between a loopback connection and a host socket until each side has
/// closed its direction (the egress relay's, and a preview port's tunnel, [`crate::ports`]).
/// One direction runs on a thread of its own; a thread that cannot start drops both.
pub fn splice(tcp: TcpStream, unix: UnixStream) {
    let (Ok(mut tcp_back), Ok(mut unix_back)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let back = thread::Builder::new()
        .name("relay-back".into())
        .spawn(move || {
            let _ = io::copy(&mut unix_back, &mut tcp_back);
            let _ = tcp_back.shutdown(Shutdown::Write);
        });
    if back.is_err() {
        return;
    }
    let (mut tcp, mut unix) = (tcp, unix);
    let _ = io::copy(&mut tcp, &mut unix);
    let _ = unix.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_proxy_variable_is_set_in_both_spellings() {
        let env = proxy_env(sandbox_protocol::EGRESS_PROXY_PORT);
        for name in ["HTTP_PROXY", "https_proxy", "ALL_PROXY", "no_proxy"] {
            assert!(env.iter().any(|(k, _)| k == name), "{name} missing");
        }
        assert!(env.contains(&("https_proxy".into(), "http://127.0.0.1:3128".into())));
    }
}
