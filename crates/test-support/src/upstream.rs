//! Fake upstream servers on 127.0.0.1 for egress tests and benches: what the egress proxy
//! dials once it has allowed a destination.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A TCP echo server on 127.0.0.1, returning its port: from a `CONNECT` proxy's side, an
/// HTTPS origin is exactly this (bytes in a tunnel).
pub async fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("port").port();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

/// A one-request-per-connection HTTP/1.1 server on 127.0.0.1, returning its port. `answer`
/// gets the request's path and `Host` header and returns the whole response (status line,
/// headers, body); the connection is closed after it.
pub async fn http_server(answer: impl Fn(&str, &str) -> String + Send + Sync + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("port").port();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let path = text.split(' ').nth(1).unwrap_or("/");
                let host = text
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("host").then(|| value.trim())
                    })
                    .unwrap_or("");
                let response = answer(path, host);
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    port
}

/// A `200 OK` response with `body`, closing the connection.
pub fn ok(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
