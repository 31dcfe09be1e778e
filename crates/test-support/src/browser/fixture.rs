//! A small web site on 127.0.0.2 for the browser tests: a login form (name and password)
//! that sets a cookie, a page that shows who is logged in, a page whose text appears late,
//! a key logger and a long page. It records every form body it receives.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const HOST: &str = "127.0.0.2";

pub struct Fixture {
    pub port: u16,
    /// Form bodies received by POST /login, in order.
    pub received: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const LOGIN: &str = r#"<!doctype html><html><head><title>Login</title></head><body>
<h1>Sign in</h1>
<form method="post" action="/login">
  <label for="user">User name</label> <input id="user" name="user" type="text">
  <label for="password">Password</label> <input id="password" name="password" type="password">
  <input type="submit" value="Sign in">
</form>
<a href="/late">Late page</a>
</body></html>"#;

const LATE: &str = r#"<!doctype html><html><head><title>Late</title></head><body>
<p id="p">loading</p>
<script>setTimeout(() => { document.getElementById('p').textContent = 'arrived late'; }, 700);</script>
</body></html>"#;

const KEYS: &str = r#"<!doctype html><html><head><title>Keys</title></head><body>
<input id="k" aria-label="key field" onkeydown="document.getElementById('out').textContent = 'pressed ' + event.key">
<p id="out">nothing pressed</p>
</body></html>"#;

const LONG: &str = r#"<!doctype html><html><head><title>Long</title></head><body>
<div style="height: 5000px; background: linear-gradient(white, navy)">top</div><p>bottom</p>
</body></html>"#;

impl Fixture {
    pub async fn start() -> Self {
        let listener = TcpListener::bind((HOST, 0))
            .await
            .expect("bind 127.0.0.2 (all of 127/8 is loopback on Linux)");
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, log.clone()));
            }
        });
        Self {
            port,
            received,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{HOST}:{}{path}", self.port)
    }
}

async fn serve(mut stream: TcpStream, log: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 * 1024 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default().to_string();
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    // Through the egress proxy a plain-HTTP request arrives in origin form (the proxy
    // rewrites it), but accept an absolute URI too.
    let target = parts.next().unwrap_or("/").to_string();
    let path = match target.find("://") {
        Some(i) => target[i + 3..]
            .find('/')
            .map_or("/".to_string(), |j| target[i + 3 + j..].to_string()),
        None => target,
    };
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let body = String::from_utf8_lossy(&body).to_string();
    let user = header("cookie").and_then(|c| {
        c.split(';')
            .find_map(|kv| kv.trim().strip_prefix("user=").map(str::to_string))
    });
    let (status, extra, page) = match (method.as_str(), path.as_str()) {
        ("GET", "/") => ("200 OK", String::new(), LOGIN.to_string()),
        ("POST", "/login") => {
            log.lock().unwrap().push(body.clone());
            let name = body
                .split('&')
                .find_map(|kv| kv.strip_prefix("user="))
                .unwrap_or_default()
                .to_string();
            let page = format!(
                "<!doctype html><html><head><title>Welcome</title></head><body><p>server received {body}</p></body></html>"
            );
            (
                "200 OK",
                format!("Set-Cookie: user={name}; Path=/\r\n"),
                page,
            )
        }
        ("GET", "/me") => {
            let who = user.map_or("anonymous".to_string(), |u| format!("logged in as {u}"));
            ("200 OK", String::new(), format!("<!doctype html><html><head><title>Me</title></head><body><p>{who}</p></body></html>"))
        }
        // Allowed by the navigation check, but the redirect leads to 127.0.0.1: only the
        // egress proxy can stop that.
        ("GET", "/to-local") => {
            let port = stream.local_addr().map(|a| a.port()).unwrap_or(0);
            (
                "302 Found",
                format!("Location: http://localhost:{port}/\r\n"),
                String::new(),
            )
        }
        ("GET", "/download") => (
            "200 OK",
            "Content-Disposition: attachment; filename=\"x.bin\"\r\n".to_string(),
            "not for the disk".to_string(),
        ),
        ("GET", "/late") => ("200 OK", String::new(), LATE.to_string()),
        ("GET", "/keys") => ("200 OK", String::new(), KEYS.to_string()),
        ("GET", "/long") => ("200 OK", String::new(), LONG.to_string()),
        _ => (
            "404 Not Found",
            String::new(),
            "<html><body>not found</body></html>".to_string(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{page}",
        page.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}
