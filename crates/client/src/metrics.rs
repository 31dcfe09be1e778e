//! Reading a service's Prometheus endpoint (`SANDMESH_METRICS_ADDR`): one HTTP/1.1 request
//! over TCP and the text format (0.0.4) parsed into samples. Tests and the loadtest use it to
//! compare the counters with the results they stored; it is not a general Prometheus client.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bound on a response: a scrape of every sandmesh service is a few tens of KiB.
const MAX_RESPONSE: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("metrics endpoint {addr}: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics endpoint {addr}: no answer within {limit:?}")]
    TimedOut { addr: SocketAddr, limit: Duration },
    #[error("metrics endpoint {addr}: not an HTTP response")]
    Malformed { addr: SocketAddr },
    #[error("metrics endpoint {addr}: HTTP {status}: {body}")]
    Status {
        addr: SocketAddr,
        status: u16,
        body: String,
    },
    #[error("metrics line {line}: {text:?} is not in the Prometheus text format")]
    Parse { line: usize, text: String },
}

/// An HTTP response: status, headers (names lower-cased) and body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// Sends `method path` to `addr` and reads the whole answer (the connection is closed after
/// it), within `limit`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    limit: Duration,
) -> Result<HttpResponse, ScrapeError> {
    let head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    raw(addr, head.as_bytes(), limit).await
}

/// Writes `bytes` as they are (well-formed or not) and reads the answer, within `limit`.
pub async fn raw(
    addr: SocketAddr,
    bytes: &[u8],
    limit: Duration,
) -> Result<HttpResponse, ScrapeError> {
    let io = |source| ScrapeError::Io { addr, source };
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.map_err(io)?;
        stream.write_all(bytes).await.map_err(io)?;
        let mut answer = Vec::new();
        stream
            .take(MAX_RESPONSE)
            .read_to_end(&mut answer)
            .await
            .map_err(io)?;
        Ok(answer)
    };
    let answer = tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| ScrapeError::TimedOut { addr, limit })??;
    parse_response(&answer).ok_or(ScrapeError::Malformed { addr })
}

fn parse_response(bytes: &[u8]) -> Option<HttpResponse> {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(HttpResponse {
        status,
        headers,
        body: body.to_string(),
    })
}

/// `GET /metrics` from `addr`, parsed; anything but 200 is an error.
pub async fn scrape(addr: SocketAddr) -> Result<Samples, ScrapeError> {
    let r = request(addr, "GET", "/metrics", Duration::from_secs(10)).await?;
    if r.status != 200 {
        return Err(ScrapeError::Status {
            addr,
            status: r.status,
            body: r.body,
        });
    }
    Samples::parse(&r.body)
}

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples(pub Vec<Sample>);

impl Samples {
    /// Parses the Prometheus text format; comments and blank lines are skipped.
    pub fn parse(text: &str) -> Result<Self, ScrapeError> {
        let mut samples = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let sample = parse_sample(line).ok_or_else(|| ScrapeError::Parse {
                line: i + 1,
                text: line.to_string(),
            })?;
            samples.push(sample);
        }
        Ok(Self(samples))
    }

    /// The sum of `name`'s samples whose labels include all of `labels` (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        // A fold from +0.0: `Sum` of no floats is -0.0, which prints as "-0".
        self.matching(name, labels)
            .fold(0.0, |sum, s| sum + s.value)
    }

    /// `name`'s samples whose labels include all of `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    // The value, then an optional timestamp.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `k="v",...}` → the labels and what follows the closing brace. Values may escape `\"`,
/// `\\` and `\n`.
fn parse_labels(mut s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after) = s.split_once('=')?;
        let mut chars = after.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_string(), value);
        s = &after[1 + end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters_histograms_and_escaped_labels() {
        let text = "# HELP sandbox_executions_total Executions.\n\
            # TYPE sandbox_executions_total counter\n\
            sandbox_executions_total{status=\"ok\",tier=\"ephemeral\"} 3\n\
            sandbox_executions_total{status=\"denied\",tier=\"reject\"} 1\n\
            sandbox_execution_duration_seconds_bucket{tier=\"ephemeral\",le=\"+Inf\"} 3\n\
            sandbox_execution_duration_seconds_count{tier=\"ephemeral\"} 3\n\
            odd{v=\"a\\\"b,c}\\\\\"} 1.5 1700000000\n\
            plain 7\n";
        let s = Samples::parse(text).unwrap();
        assert_eq!(s.sum("sandbox_executions_total", &[]), 4.0);
        assert_eq!(s.sum("sandbox_executions_total", &[("status", "ok")]), 3.0);
        assert_eq!(s.sum("sandbox_execution_duration_seconds_count", &[]), 3.0);
        let odd = s.matching("odd", &[]).next().unwrap();
        assert_eq!(odd.labels["v"], "a\"b,c}\\");
        assert_eq!(odd.value, 1.5);
        assert_eq!(s.sum("plain", &[]), 7.0);
        assert_eq!(s.sum("absent", &[]), 0.0);
    }

    #[test]
    fn refuses_what_is_not_the_text_format() {
        for bad in [
            "name{a=\"unterminated} 1",
            "name{a=1} 2",
            "lonely",
            "x NaNx",
        ] {
            let e = Samples::parse(bad).unwrap_err();
            assert!(
                matches!(e, ScrapeError::Parse { line: 1, .. }),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn reads_status_headers_and_body() {
        let r =
            parse_response(b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\n\r\nuse GET\n")
                .unwrap();
        assert_eq!(r.status, 405);
        assert_eq!(r.headers["allow"], "GET, HEAD");
        assert_eq!(r.body, "use GET\n");
        assert!(parse_response(b"garbage").is_none());
    }
}
