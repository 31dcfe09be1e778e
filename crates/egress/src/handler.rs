//! One proxied request: CONNECT becomes a byte tunnel, an absolute-URI request is forwarded
//! over a fresh upstream connection. Both go through [`Handler::open`], which decides, resolves,
//! checks the address and dials exactly that address.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONNECTION, CONTENT_TYPE, HOST};
use hyper::http::uri::{Authority, Scheme};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::resolver::Resolver;
use crate::rules::{EgressRules, Refusal, Target};
use crate::stats::{Counted, Counters, EgressEvent, Observer};

/// Buffer per direction of a CONNECT tunnel. Four times tokio's default: a bulk download
/// through the tunnel then costs far fewer wake-ups (the proxy bench in `benches/proxy.rs`
/// measures it), at 64 KiB per tunnel (both directions), MAX_CONNECTIONS per container.
const TUNNEL_BUFFER: usize = 32 * 1024;

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1, plus the proxy ones).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Everything a request of one container's proxy needs; shared by its connections.
pub(crate) struct Handler {
    pub(crate) rules: EgressRules,
    pub(crate) resolver: Arc<dyn Resolver>,
    pub(crate) observer: Option<Observer>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) connect_timeout: Duration,
    /// Cancelled when the proxy closes: ends tunnels and upstream connections.
    pub(crate) stop: CancellationToken,
}

impl Handler {
    pub(crate) async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        if req.method() == Method::CONNECT {
            self.tunnel(req).await
        } else {
            self.forward(req).await
        }
    }

    async fn tunnel(&self, req: Request<Incoming>) -> Response<Body> {
        let Some((host, port)) = req
            .uri()
            .authority()
            .and_then(|a| Some((a.host().to_string(), a.port_u16()?)))
        else {
            return plain(StatusCode::BAD_REQUEST, "CONNECT needs host:port");
        };
        let mut upstream = match self.open(&host, port).await {
            Ok(upstream) => upstream,
            Err(refused) => return refused,
        };
        let stop = self.stop.clone();
        tokio::spawn(async move {
            // The client gets the tunnel once hyper has sent our 200.
            let upgraded = match hyper::upgrade::on(req).await {
                Ok(upgraded) => upgraded,
                Err(e) => return tracing::debug!(error = %e, "CONNECT upgrade failed"),
            };
            let mut client = TokioIo::new(upgraded);
            tokio::select! {
                _ = stop.cancelled() => {}
                copied = tokio::io::copy_bidirectional_with_sizes(
                    &mut client, &mut upstream, TUNNEL_BUFFER, TUNNEL_BUFFER,
                ) => {
                    if let Err(e) = copied {
                        tracing::debug!(error = %e, "tunnel ended");
                    }
                }
            }
        });
        Response::new(Empty::new().map_err(|never| match never {}).boxed())
    }

    async fn forward(&self, mut req: Request<Incoming>) -> Response<Body> {
        let uri = req.uri().clone();
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            return plain(
                StatusCode::BAD_REQUEST,
                "a proxy request needs an absolute URI (http://host/path) or CONNECT",
            );
        };
        if *scheme != Scheme::HTTP {
            return plain(
                StatusCode::BAD_REQUEST,
                "only http:// is forwarded; use CONNECT",
            );
        }
        let host = authority.host().to_string();
        let port = authority.port_u16().unwrap_or(80);
        if !host_header_agrees(req.headers(), &host, port) {
            let rule = "Host header does not match the request target";
            self.report(&host, port, None, false, rule);
            return plain(StatusCode::BAD_REQUEST, rule);
        }
        let upstream = match self.open(&host, port).await {
            Ok(upstream) => upstream,
            Err(refused) => return refused,
        };
        let (mut sender, connection) =
            match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
                Ok(parts) => parts,
                Err(e) => return plain(StatusCode::BAD_GATEWAY, format!("upstream: {e}")),
            };
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                ended = connection => {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "upstream connection ended");
                    }
                }
            }
        });
        *req.uri_mut() = origin_form(&uri);
        strip_hop_by_hop(req.headers_mut());
        let host_header = match authority.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        match HeaderValue::from_str(&host_header) {
            Ok(value) => req.headers_mut().insert(HOST, value),
            Err(_) => return plain(StatusCode::BAD_REQUEST, "bad host"),
        };
        match sender.send_request(req).await {
            Ok(mut response) => {
                strip_hop_by_hop(response.headers_mut());
                response.map(BodyExt::boxed)
            }
            Err(e) => plain(StatusCode::BAD_GATEWAY, format!("upstream: {e}")),
        }
    }

    /// Decides on `host:port`, resolves a name, checks every answer and dials the first that
    /// passes. Each outcome is reported once; an error is the response to send instead.
    async fn open(&self, host: &str, port: u16) -> Result<Counted<TcpStream>, Response<Body>> {
        let refuse = |address: Option<IpAddr>, refusal: Refusal| {
            let rule = refusal.to_string();
            self.report(host, port, address, false, &rule);
            plain(StatusCode::FORBIDDEN, rule)
        };
        let (ip, rule) = match self.rules.check_target(host, port) {
            Err(refusal) => return Err(refuse(None, refusal)),
            Ok(Target::Address { ip, rule }) => (ip, rule),
            Ok(Target::Name { host: name, rule }) => {
                let lookup = self.resolver.resolve(&name);
                let answers = match tokio::time::timeout(self.connect_timeout, lookup).await {
                    Ok(Ok(answers)) => answers,
                    Ok(Err(e)) => {
                        let rule = format!("cannot resolve {name}: {e}");
                        self.report(host, port, None, false, &rule);
                        return Err(plain(StatusCode::BAD_GATEWAY, rule));
                    }
                    Err(_) => {
                        let rule = format!("resolving {name} timed out");
                        self.report(host, port, None, false, &rule);
                        return Err(plain(StatusCode::GATEWAY_TIMEOUT, rule));
                    }
                };
                let checked: Vec<_> = answers
                    .into_iter()
                    .map(|ip| (ip.to_canonical(), self.rules.check_resolved(ip)))
                    .collect();
                // A mixed answer is served from its acceptable part: the dialed address is
                // the checked one, so the others cannot be reached through it.
                match checked.iter().find(|(_, verdict)| verdict.is_ok()) {
                    Some((ip, Ok(Some(cidr)))) => (*ip, format!("{rule}, {cidr}")),
                    Some((ip, _)) => (*ip, rule),
                    None => match checked.into_iter().next() {
                        Some((ip, Err(refusal))) => return Err(refuse(Some(ip), refusal)),
                        _ => {
                            let rule = format!("cannot resolve {name}: no addresses");
                            self.report(host, port, None, false, &rule);
                            return Err(plain(StatusCode::BAD_GATEWAY, rule));
                        }
                    },
                }
            }
        };
        self.report(host, port, Some(ip), true, &rule);
        let address = SocketAddr::new(ip, port);
        match tokio::time::timeout(self.connect_timeout, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => Ok(Counted::new(stream, self.counters.clone())),
            Ok(Err(e)) => Err(plain(
                StatusCode::BAD_GATEWAY,
                format!("cannot connect to {address}: {e}"),
            )),
            Err(_) => Err(plain(
                StatusCode::GATEWAY_TIMEOUT,
                format!("connecting to {address} timed out"),
            )),
        }
    }

    fn report(&self, host: &str, port: u16, address: Option<IpAddr>, allowed: bool, rule: &str) {
        self.counters.decided(allowed);
        tracing::info!(host, port, ?address, allowed, rule, "egress decision");
        if let Some(observer) = &self.observer {
            observer(&EgressEvent {
                host: host.to_string(),
                port,
                address,
                allowed,
                rule: rule.to_string(),
            });
        }
    }
}

/// An absolute-URI request may carry at most one Host header, naming the same host and port
/// as its target; anything else could make the upstream serve a host the policy never saw.
fn host_header_agrees(headers: &HeaderMap, host: &str, port: u16) -> bool {
    let mut values = headers.get_all(HOST).iter();
    match (values.next(), values.next()) {
        (None, _) => true,
        (Some(value), None) => value
            .to_str()
            .ok()
            .and_then(|text| text.parse::<Authority>().ok())
            .is_some_and(|a| {
                a.host().eq_ignore_ascii_case(host) && a.port_u16().unwrap_or(80) == port
            }),
        (Some(_), Some(_)) => false,
    }
}

fn origin_form(uri: &Uri) -> Uri {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    path.parse().unwrap_or_else(|_| Uri::from_static("/"))
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    for name in HOP_BY_HOP
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        headers.remove(name);
    }
}

/// A plain-text response: refusals name their rule in the body.
pub(crate) fn plain(status: StatusCode, text: impl Into<String>) -> Response<Body> {
    let body = Full::new(Bytes::from(text.into() + "\n"));
    let mut response = Response::new(body.map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
