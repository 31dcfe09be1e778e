//! Network egress through the per-container proxy, with the real Docker daemon and
//! real sockets: every upstream is a server this test runs on 127.0.0.1, reached from inside
//! the sandbox only through the container's egress socket (the policy's explicit
//! `127.0.0.1/32` CIDR is the exception that lets it through at all).

use std::time::Duration;

use crate::common::{run, run_of, DockerRuns, Harness};
use futures::StreamExt;
use messages::audit::{AuditDetails, AuditEvent, EgressEvent};
use messages::exec::{ExecResult, ExecStatus, Language};
use messages::executor::{ExecutorRun, RunKind};
use messages::network::NetworkPolicy;
use test_support::upstream;

/// Python helpers the sandbox code uses to speak to the relay at 127.0.0.1:3128 directly, so
/// each test controls the exact request line and headers a hostile client could send.
const CLIENT: &str = r#"
import socket
def _head(s):
    data = b""
    while b"\r\n\r\n" not in data:
        c = s.recv(4096)
        if not c:
            break
        data += c
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(rest) < length:
        c = s.recv(4096)
        if not c:
            break
        rest += c
    return head.split(b"\r\n")[0].decode(), rest.decode(errors="replace").strip()
def raw(text):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(text.encode())
    status, body = _head(s)
    s.close()
    return status + " | " + body
def get(url, host=None):
    host = host or url.split("/")[2]
    return raw(f"GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
def connect(target):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    status, body = _head(s)
    if " 200" in status:
        s.sendall(b"ping through the tunnel")
        body = s.recv(4096).decode()
    s.close()
    return status + " | " + body
"#;

/// A plain HTTP/1.1 upstream: `/redirect` answers 302 to the cloud metadata address, every
/// other path 200 with a body naming the path and the Host header it received.
async fn http_upstream() -> u16 {
    upstream::http_server(|path, host| {
        if path == "/redirect" {
            "HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
                .to_string()
        } else {
            upstream::ok(&format!("upstream saw {path} for {host}"))
        }
    })
    .await
}

fn policy(json: serde_json::Value) -> NetworkPolicy {
    serde_json::from_value(json).expect("policy")
}

/// A run in a container of its own with `network`.
fn isolated(code: &str, network: Option<NetworkPolicy>) -> ExecutorRun {
    let isolated = RunKind::Isolated {
        session_grade: false,
    };
    let mut r = run_of(isolated, Language::Python, code);
    r.network = network;
    r.edit_request(|r| r.timeout_ms = Some(20_000));
    r
}

fn lines(r: &ExecResult) -> Vec<String> {
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    r.stdout.lines().map(str::to_string).collect()
}

/// Egress decisions audited for one execution, read from the subscription until `n` arrived.
async fn audited(sub: &mut async_nats::Subscriber, execution: &str, n: usize) -> Vec<EgressEvent> {
    let mut found = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while found.len() < n {
        let Ok(Some(message)) = tokio::time::timeout_at(until, sub.next()).await else {
            panic!(
                "only {} of {n} egress audit events: {found:#?}",
                found.len()
            );
        };
        let event: AuditEvent = serde_json::from_slice(&message.payload).expect("audit event");
        match event.details {
            AuditDetails::EgressEvent(d) if event.execution_id.as_deref() == Some(execution) => {
                found.push(d)
            }
            _ => {}
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_hosts_pass_over_http_and_connect_and_others_get_403() {
    let h = Harness::start().await;
    let (web, echo) = (http_upstream().await, upstream::echo_server().await);
    let mut audit = h
        .client
        .subscribe(h.subjects.audit(None, "egress"))
        .await
        .unwrap();
    let code = format!(
        "{CLIENT}
print(get('http://localhost:{web}/hello'))
print(connect('localhost:{echo}'))
print(get('http://denied.example/'))
import urllib.request, urllib.error, os
print(os.environ['HTTPS_PROXY'], os.environ['no_proxy'])
try:
    urllib.request.urlopen('http://also-denied.example/', timeout=10)
except urllib.error.HTTPError as e:
    print('urllib', e.code, e.read().decode().strip())
"
    );
    let network = policy(serde_json::json!({
        "allow_domains": ["localhost"],
        "allow_cidrs": ["127.0.0.1/32"],
        "ports": [web, echo, 80],
    }));
    let r = h.call(&isolated(&code, Some(network))).await.expect("run");
    let out = lines(&r);
    assert_eq!(
        out[0],
        format!("HTTP/1.1 200 OK | upstream saw /hello for localhost:{web}")
    );
    assert_eq!(
        out[1], "HTTP/1.1 200 OK | ping through the tunnel",
        "CONNECT tunnels bytes both ways"
    );
    assert_eq!(
        out[2],
        "HTTP/1.1 403 Forbidden | denied.example is not in allow_domains"
    );
    assert_eq!(out[3], "http://127.0.0.1:3128 localhost,127.0.0.1");
    assert_eq!(
        out[4], "urllib 403 also-denied.example is not in allow_domains",
        "programs find the proxy through the standard variables"
    );
    let report = r
        .network
        .expect("a run with a policy reports its network use");
    let contacted: Vec<String> = report
        .contacted
        .iter()
        .map(|c| format!("{}:{}", c.host, c.port))
        .collect();
    assert_eq!(
        contacted,
        [format!("localhost:{web}"), format!("localhost:{echo}")]
    );
    let refused: Vec<&str> = report.refused.iter().map(|c| c.host.as_str()).collect();
    assert_eq!(refused, ["denied.example", "also-denied.example"]);
    let events = audited(&mut audit, &r.execution_id, 4).await;
    let allowed = events.iter().filter(|e| e.allowed).count();
    assert_eq!(allowed, 2, "{events:#?}");
    assert!(events
        .iter()
        .any(|e| e.host == "denied.example" && e.rule == "denied.example is not in allow_domains"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bypasses_are_refused_and_audited() {
    let h = Harness::start().await;
    let web = http_upstream().await;
    let mut audit = h
        .client
        .subscribe(h.subjects.audit(None, "egress"))
        .await
        .unwrap();
    // With the loopback CIDR: the upstream is reachable, and each trick around the policy is
    // judged on its own.
    let with_cidr = format!(
        "{CLIENT}
print(get('http://localhost:{web}/redirect'))
print(get('http://169.254.169.254/latest/meta-data/'))
print(get('http://localhost:{web}/', host='metadata.google.internal'))
print(connect('localhost:2222'))
"
    );
    let network = policy(serde_json::json!({
        "allow_domains": ["localhost"],
        "allow_cidrs": ["127.0.0.1/32"],
        "ports": [web, 80, 443],
    }));
    let r = h
        .call(&isolated(&with_cidr, Some(network)))
        .await
        .expect("run");
    let out = lines(&r);
    assert!(
        out[0].starts_with("HTTP/1.1 302 Found"),
        "the allowed host answers: {out:?}"
    );
    assert_eq!(
        out[1], "HTTP/1.1 403 Forbidden | 169.254.169.254 is not in allow_cidrs",
        "following the redirect to the metadata address is a new request, refused"
    );
    assert_eq!(
        out[2],
        "HTTP/1.1 400 Bad Request | Host header does not match the request target"
    );
    assert_eq!(
        out[3], "HTTP/1.1 403 Forbidden | port 2222 not allowed",
        "an allowed name on another port"
    );
    let refused: Vec<(String, u16)> = r
        .network
        .expect("report")
        .refused
        .iter()
        .map(|c| (c.host.clone(), c.port))
        .collect();
    assert_eq!(
        refused,
        [
            ("169.254.169.254".to_string(), 80),
            ("localhost".to_string(), web),
            ("localhost".to_string(), 2222),
        ]
    );
    audited(&mut audit, &r.execution_id, 4).await;

    // Without it: the name resolving to loopback is refused after resolution, an IP literal
    // needs a CIDR, and nothing reaches the network around the proxy.
    let without = format!(
        "{CLIENT}
print(get('http://localhost:{web}/'))
print(connect('127.0.0.1:{web}'))
import socket
for what, attempt in [
    ('tcp', lambda: socket.create_connection(('1.1.1.1', 80), timeout=3)),
    ('udp-dns', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))),
    ('resolve', lambda: socket.getaddrinfo('example.com', 443)),
    ('tcp-host', lambda: socket.create_connection(('172.17.0.1', 80), timeout=3)),
]:
    try:
        attempt()
        print(what, 'REACHED')
    except OSError as e:
        print(what, 'failed', type(e).__name__)
"
    );
    let network = policy(serde_json::json!({"allow_domains": ["localhost"], "ports": [web]}));
    let r = h
        .call(&isolated(&without, Some(network)))
        .await
        .expect("run");
    let out = lines(&r);
    assert_eq!(
        out[0],
        "HTTP/1.1 403 Forbidden | resolves to 127.0.0.1: loopback"
    );
    assert_eq!(
        out[1],
        "HTTP/1.1 403 Forbidden | 127.0.0.1 is not in allow_cidrs"
    );
    for (line, what) in out[2..]
        .iter()
        .zip(["tcp", "udp-dns", "resolve", "tcp-host"])
    {
        assert!(
            line.starts_with(&format!("{what} failed")),
            "{what} must not leave the container: {line}"
        );
    }
    let events = audited(&mut audit, &r.execution_id, 2).await;
    assert!(events.iter().all(|e| !e.allowed), "{events:#?}");
    // Each refusal's event names its rule; the two connections are judged concurrently, so
    // their events may come in either order.
    let mut rules: Vec<&str> = events.iter().map(|e| e.rule.as_str()).collect();
    rules.sort_unstable();
    assert_eq!(
        rules,
        [
            "127.0.0.1 is not in allow_cidrs",
            "resolves to 127.0.0.1: loopback"
        ],
        "the audit names each rule"
    );
    h.stop().await;
}

/// The host directory of `container`'s egress socket, from Docker's view of its mounts.
async fn egress_mounts(h: &Harness, container: &str) -> Vec<String> {
    let inspect = h
        .backend
        .docker
        .inspect_container(
            container,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .expect("inspect");
    inspect
        .mounts
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.destination.as_deref() == Some(docker_executor::egress::EGRESS_MOUNT))
        .filter_map(|m| m.source)
        .collect()
}

fn session_run(session: &str, code: &str, network: Option<NetworkPolicy>) -> ExecutorRun {
    let mut r = run(Some(session), Language::Python, code);
    r.network = network;
    r
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_reaches_only_its_own_socket_which_goes_with_it() {
    let base = tempfile::tempdir().unwrap();
    let base_dir = base.path().to_str().unwrap().to_string();
    let h = Harness::start_with(&[("SANDMESH_EXEC_EGRESS_DIR", &base_dir)]).await;
    let web = http_upstream().await;
    let network = policy(serde_json::json!({
        "allow_domains": ["localhost"], "allow_cidrs": ["127.0.0.1/32"], "ports": [web],
    }));
    let (a, b) = ("egress-a", "egress-b");
    let first = h
        .call_node(&session_run(a, "print('a up')", Some(network.clone())))
        .await
        .expect("session a");
    assert_eq!(first.stdout, "a up\n", "{first:?}");
    h.call_node(&session_run(b, "print('b up')", Some(network)))
        .await
        .expect("session b");
    let (ca, cb) = (h.session_container(a).await, h.session_container(b).await);
    let (ma, mb) = (egress_mounts(&h, &ca).await, egress_mounts(&h, &cb).await);
    assert_eq!((ma.len(), mb.len()), (1, 1), "one socket directory each");
    assert_ne!(ma, mb);
    let a_socket = format!("{}/egress.sock", ma[0]);
    // From b: a's socket path (the host's) does not exist in b, and b's mount holds one socket.
    let probe = format!(
        "{CLIENT}
import os, socket
print(os.listdir('/run/sandmesh-egress'))
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({a_socket:?})
    print('CONNECTED to a')
except OSError as e:
    print('a unreachable', type(e).__name__)
print(get('http://localhost:{web}/from-b'))
try:
    open('/run/sandmesh-egress/x', 'w')
except OSError as e:
    print('read-only', type(e).__name__)
"
    );
    let r = h
        .call_node(&session_run(b, &probe, None))
        .await
        .expect("probe");
    let out = lines(&r);
    assert_eq!(out[0], "['egress.sock']");
    assert_eq!(out[1], "a unreachable FileNotFoundError");
    assert!(
        out[2].starts_with("HTTP/1.1 200 OK"),
        "b's own socket works: {out:?}"
    );
    assert!(out[3].starts_with("read-only"), "{out:?}");
    assert!(
        std::path::Path::new(&a_socket).exists(),
        "a's socket lives while a does"
    );
    // Closing a removes its container, and with it the socket, its directory and its proxy.
    assert!(h.close(a).await);
    assert!(
        !std::path::Path::new(&ma[0]).exists(),
        "a's directory is gone"
    );
    let r = h
        .call_node(&session_run(b, "print('b still')", None))
        .await
        .expect("b");
    assert_eq!(r.stdout, "b still\n");
    h.stop().await;
    let left: Vec<_> = std::fs::read_dir(base.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "nothing left in the egress directory: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_policy_there_is_no_network_and_pooled_runs_cannot_have_one() {
    let h = Harness::start().await;
    let code = "import os, socket
print(os.path.exists('/run/sandmesh-egress'), 'HTTP_PROXY' in os.environ)
try:
    socket.create_connection(('127.0.0.1', 3128), timeout=3)
    print('relay REACHED')
except OSError as e:
    print('no relay', type(e).__name__)
";
    let r = h.ephemeral(Language::Python, code).await;
    assert_eq!(
        r.stdout, "False False\nno relay ConnectionRefusedError\n",
        "{r:?}"
    );
    assert_eq!(r.network, None);
    let mut pooled = run(None, Language::Python, "print(1)");
    pooled.network = Some(policy(serde_json::json!({"allow_all": true})));
    let e = h
        .call(&pooled)
        .await
        .expect_err("a warm container has no socket");
    assert!(
        e.to_string().contains("run kind isolated or session"),
        "{e}"
    );
    let bad = isolated(
        "print(1)",
        Some(policy(serde_json::json!({"allow_domains": ["*"]}))),
    );
    let e = h.call(&bad).await.expect_err("bare * without allow_all");
    assert!(e.to_string().contains("allow_all"), "{e}");
    h.stop().await;
}

/// The package index hosts from configuration (`SANDMESH_TEST_PYPI_HOSTS`, set by
/// scripts/test.sh), never from this code.
fn pypi_hosts() -> Vec<String> {
    let hosts = std::env::var("SANDMESH_TEST_PYPI_HOSTS").unwrap_or_else(|_| {
        panic!(
            "SANDMESH_TEST_PYPI_HOSTS is not set: name the Python package index hosts this \
             machine reaches, comma-separated (scripts/test.sh sets them from this machine's \
             pip: scripts/pip-index-hosts.py)"
        )
    });
    hosts.split(',').map(|h| h.trim().to_string()).collect()
}

/// Addresses the index hosts resolve to here that the proxy would refuse as internal (a
/// machine whose resolver answers with a gateway in a reserved range): the policy must name
/// them as CIDRs, exactly as an operator of such a network would.
async fn internal_addresses_of(hosts: &[String]) -> Vec<String> {
    let mut cidrs = Vec::new();
    for host in hosts {
        let resolved = tokio::net::lookup_host((host.as_str(), 443))
            .await
            .unwrap_or_else(|e| panic!("{host} does not resolve on this machine: {e}"));
        for addr in resolved {
            if egress::internal_range(addr.ip()).is_some() {
                let cidr = format!("{}/{}", addr.ip(), if addr.is_ipv4() { 32 } else { 128 });
                if !cidrs.contains(&cidr) {
                    eprintln!("{host} resolves to {} here: allowing {cidr}", addr.ip());
                    cidrs.push(cidr);
                }
            }
        }
    }
    cidrs
}

/// The trust store for the index (`SANDMESH_TEST_PYPI_CA_BUNDLE`, optional): a machine whose
/// HTTPS goes through an intercepting gateway trusts that gateway's CA, and so must pip in the
/// sandbox. It travels as a request file; `--cert` points pip at it.
fn pypi_ca_bundle() -> Option<messages::exec::FileSpec> {
    let path = std::env::var("SANDMESH_TEST_PYPI_CA_BUNDLE").ok()?;
    if path.is_empty() {
        return None;
    }
    let content = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("SANDMESH_TEST_PYPI_CA_BUNDLE={path}: {e}"));
    Some(messages::exec::FileSpec {
        path: "ca.pem".into(),
        content,
        encoding: Default::default(),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn pip_downloads_a_package_through_the_proxy_and_not_without_it() {
    let hosts = pypi_hosts();
    let ca = pypi_ca_bundle();
    let h = Harness::start().await;
    let cert = if ca.is_some() {
        "--cert /workspace/ca.pem"
    } else {
        ""
    };
    let code = format!(
        "python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
         --retries 0 --timeout 20 {cert} -d /tmp/pkgs six==1.16.0 && ls /tmp/pkgs"
    );
    let code = code.as_str();
    let network = NetworkPolicy {
        allow_domains: hosts.clone(),
        allow_cidrs: internal_addresses_of(&hosts).await,
        ..Default::default()
    };
    let mut with = isolated(code, Some(network));
    with.edit_request(|r| r.language = Language::Shell);
    with.edit_request(|r| {
        r.files.extend(ca.clone());
    });
    with.edit_request(|r| r.timeout_ms = Some(90_000));
    let r = h.call(&with).await.expect("pip with a policy");
    assert_eq!(r.status, ExecStatus::Ok, "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("six-1.16.0-py2.py3-none-any.whl"),
        "{}",
        r.stdout
    );
    let contacted: Vec<&str> = r
        .network
        .as_ref()
        .expect("report")
        .contacted
        .iter()
        .map(|c| c.host.as_str())
        .collect();
    assert!(
        contacted.iter().all(|c| hosts.iter().any(|h| h == c)),
        "{contacted:?}"
    );
    let mut without = run(None, Language::Shell, code);
    without.edit_request(|r| r.timeout_ms = Some(60_000));
    without.edit_request(|r| {
        r.files.extend(ca);
    });
    let r = h.call(&without).await.expect("pip without a policy");
    assert_eq!(r.status, ExecStatus::Error, "no network: {r:?}");
    assert!(!r.stdout.contains("six-1.16.0"), "{}", r.stdout);
    h.stop().await;
}
