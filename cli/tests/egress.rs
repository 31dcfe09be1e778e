//! `sandmesh exec --allow-domain …` end to end: `sandmesh up` with an egress ceiling
//! (`SANDMESH_NETWORK_ALLOW`), the CLI's policy flags, the scheduler's clamping, the executor's
//! proxy and the summary line saying what was contacted and refused. (Without flags the same
//! code is high risk and waits for a person; no policy means no network is shown by the
//! docker-executor's tests.) The upstream is a server
//! this test runs on 127.0.0.1, reachable only through the policy's explicit `127.0.0.1/32`.

use std::time::Duration;

use crate::common::{sandmesh, Up};
use test_support::{require_docker, upstream, NatsServer};

#[tokio::test(flavor = "multi_thread")]
async fn exec_with_allow_domain_reaches_the_host_and_nothing_else() {
    require_docker();
    let web = upstream::http_server(|path, _| upstream::ok(&format!("upstream saw {path}"))).await;
    let nats = NatsServer::start();
    let url = nats.url();
    let log = tempfile::NamedTempFile::new().unwrap();
    let ports = format!("80,443,{web}");
    let env = [
        ("SANDMESH_NETWORK_ALLOW", "localhost,127.0.0.1/32"),
        ("SANDMESH_NETWORK_PORTS", ports.as_str()),
    ];
    let mut mesh = Up::start(&url, &env, log.path());
    mesh.wait_ready(&url).await;

    // `localhost` is in NO_PROXY for the program's own loopback servers; this one lives on the
    // host, so the code sends it through the proxy explicitly.
    let code = format!(
        "import urllib.request, urllib.error
urllib.request.proxy_bypass = lambda host: False
print(urllib.request.urlopen('http://localhost:{web}/from-cli', timeout=10).read().decode())
try:
    urllib.request.urlopen('http://denied.example/', timeout=10)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
"
    );
    let port = web.to_string();
    let limit = Duration::from_secs(120);
    let allowed = [
        "exec",
        "--allow-domain",
        "localhost",
        "--allow-cidr",
        "127.0.0.1/32",
        "--allow-port",
        &port,
        "--allow-port",
        "80",
        &code,
    ];
    let out = sandmesh(&url, &allowed, limit).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout, "upstream saw /from-cli\n403 denied.example is not in allow_domains\n",
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("network: contacted [localhost:{web}]")),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "network: refused denied.example:80 — denied.example is not in allow_domains"
        ),
        "{stderr}"
    );

    // Beyond the ceiling: refused before anything runs, naming what.
    let out = sandmesh(
        &url,
        &["exec", "--allow-domain", "pkgs.example.org", "print(1)"],
        limit,
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("allow_domains pkgs.example.org"),
        "{stderr}"
    );

    assert!(mesh.stop(Duration::from_secs(90)).await.success());
}
