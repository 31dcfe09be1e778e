//! Preview ports, the sandbox's half: the resident supervisor keeps one connection to the
//! host's ports socket ([`PORTS_MOUNT`], bound by the host in a directory mounted read-only)
//! waiting for an order. An order is a port; the supervisor dials `127.0.0.1:<port>` in the
//! container's own network namespace, answers whether that worked, and splices the two
//! connections ([`crate::relay::splice`]) while it connects the next waiting one. The host
//! only ever accepts: it never connects to a path the sandbox could replace.
//!
//! Threads, like the egress relay: two per open tunnel, one waiting.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread;
use std::time::Duration;

use sandbox_protocol::{PORTS_MOUNT, PORTS_SOCKET, PORT_CONNECTED, PORT_REFUSED};

/// The longest wait between two attempts to reach a host socket that is not there (yet).
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Starts waiting for the host's orders when the container has a ports socket.
pub fn start() {
    let socket = Path::new(PORTS_MOUNT).join(PORTS_SOCKET);
    if !socket.exists() {
        return;
    }
    let spawned = thread::Builder::new()
        .name("ports-wait".into())
        .spawn(move || wait_for_orders(&socket));
    if let Err(e) = spawned {
        eprintln!("sandmesh-supervisor: preview ports unavailable: {e}");
    }
}

fn wait_for_orders(socket: &Path) -> ! {
    let mut backoff = Duration::from_millis(50);
    loop {
        let Ok(mut conn) = UnixStream::connect(socket) else {
            thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
            continue;
        };
        let mut port = [0u8; 2];
        if conn.read_exact(&mut port).is_err() {
            // The host let this connection go (it keeps only a few waiting, or it restarted):
            // a pause, so a host that refuses every connection is not spun against.
            thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
            continue;
        }
        backoff = Duration::from_millis(50);
        let port = u16::from_be_bytes(port);
        // A thread that cannot start (pids limit) drops the order: the host reports it.
        let _ = thread::Builder::new()
            .name("ports-tunnel".into())
            .spawn(move || answer(conn, port));
    }
}

/// Dials `port` on loopback (IPv4, then IPv6: servers bind either) and relays to it.
fn answer(mut conn: UnixStream, port: u16) {
    let dialed = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .or_else(|_| TcpStream::connect((Ipv6Addr::LOCALHOST, port)));
    match dialed {
        Ok(tcp) => {
            let _ = tcp.set_nodelay(true);
            if conn.write_all(&[PORT_CONNECTED]).is_ok() {
                crate::relay::splice(tcp, conn);
            }
        }
        Err(_) => {
            let _ = conn.write_all(&[PORT_REFUSED]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn an_order_is_answered_and_relayed_or_refused() {
        let server = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = server.local_addr().unwrap().port();
        let echo = thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        });
        let (mut host, sandbox) = UnixStream::pair().unwrap();
        thread::spawn(move || answer(sandbox, port));
        let mut status = [9u8; 1];
        host.read_exact(&mut status).unwrap();
        assert_eq!(status[0], PORT_CONNECTED);
        host.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        host.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"hello");
        echo.join().unwrap();

        // A port nothing listens on (the listener above is gone).
        let (mut host, sandbox) = UnixStream::pair().unwrap();
        thread::spawn(move || answer(sandbox, port));
        host.read_exact(&mut status).unwrap();
        assert_eq!(status[0], PORT_REFUSED);
    }
}
