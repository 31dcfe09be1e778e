//! The `cluster` overlay's NATS configuration, run: three nats-servers in containers that get
//! exactly what the StatefulSet's pods get (the rendered `nats.conf` and the generated
//! `accounts.conf` side by side, `POD_NAME`, a writable `/data`, read-only root, no
//! capabilities, user 10200), on a Docker network where `nats-<i>.nats-headless` resolves as
//! it does in the cluster. They must form a JetStream cluster, take an R3 stream in the
//! services' account, and keep acknowledging writes with one node killed. Real nats-server,
//! real Docker; no Kubernetes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use async_nats::jetstream;
use sandmesh_auth::{Role, Tenancy};
use sandmesh_k8s_check::render;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODES: usize = 3;
/// Any image with a root filesystem: nats-server is one static binary, mounted in.
const IMAGE: &str = "sandmesh/debian:bookworm";

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("docker {args:?}: {e}"))
}

fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(out.status.success(), "docker {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A network and three NATS containers, removed on drop.
struct Cluster {
    network: String,
    nodes: Vec<String>,
}

impl Cluster {
    fn container(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// The host address Docker published a container port on (`127.0.0.1:<port>`).
    fn published(&self, i: usize, port: u16) -> String {
        let out = docker_ok(&["port", self.container(i), &format!("{port}/tcp")]);
        out.lines().next().expect("a published port").to_string()
    }

    fn remove(&mut self) {
        for node in self.nodes.drain(..) {
            docker(&["rm", "--force", "--volumes", &node]);
        }
        if !self.network.is_empty() {
            docker(&["network", "rm", &self.network]);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.remove();
    }
}

fn nats_server() -> PathBuf {
    let bin = std::env::var_os("SANDMESH_NATS_SERVER").expect(
        "SANDMESH_NATS_SERVER must name a nats-server binary (scripts/install-tools.sh puts one \
         in .tools/bin; scripts/test.sh sets the variable)",
    );
    std::fs::canonicalize(PathBuf::from(bin)).expect("SANDMESH_NATS_SERVER exists")
}

fn require_image() {
    let present = docker(&["image", "inspect", IMAGE]).status.success();
    assert!(
        present,
        "the Docker daemon does not answer or has no {IMAGE}: start Docker and build the base \
         with deploy/images/build.sh (scripts/test.sh does)"
    );
}

/// `/healthz` of a node's monitoring port answers 200 (JetStream current, meta leader known).
async fn healthy(address: &str) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
        return false;
    };
    let request = b"GET /healthz HTTP/1.0\r\nHost: nats\r\n\r\n";
    if stream.write_all(request).await.is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response).await;
    response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200")
}

fn start(config_dir: &Path, name: &str) -> Cluster {
    let mut cluster = Cluster {
        network: String::new(),
        nodes: Vec::new(),
    };
    cluster.network = docker_ok(&["network", "create", name]);
    let config = format!("{}:/etc/nats:ro", config_dir.display());
    let binary = format!("{}:/usr/local/bin/nats-server:ro", nats_server().display());
    for i in 0..NODES {
        let pod = format!("nats-{i}");
        let container = format!("{name}-{pod}");
        docker_ok(&[
            "run",
            "--detach",
            "--name",
            &container,
            "--network",
            name,
            // What the headless Service's DNS gives the pod in Kubernetes.
            "--network-alias",
            &format!("{pod}.nats-headless"),
            "--env",
            &format!("POD_NAME={pod}"),
            "--user",
            "10200:10200",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--tmpfs",
            "/data:rw,uid=10200,gid=10200,size=256m",
            "--volume",
            &config,
            "--volume",
            &binary,
            "--publish",
            "127.0.0.1::4222",
            "--publish",
            "127.0.0.1::8222",
            "--label",
            "org.sandmesh.test=k8s-nats-cluster",
            IMAGE,
            "/usr/local/bin/nats-server",
            "-c",
            "/etc/nats/nats.conf",
        ]);
        cluster.nodes.push(container);
    }
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_overlay_forms_a_jetstream_cluster_that_survives_a_node() {
    require_image();
    let rendered =
        render::render(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../overlays/cluster"))
            .expect("the cluster overlay renders");
    let nats_conf = rendered
        .objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "nats-config")
        .and_then(|o| o["data"]["nats.conf"].as_str())
        .expect("nats.conf")
        .to_string();
    let tenancy = Tenancy::generate(&messages::Subjects::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nats.conf"), nats_conf).unwrap();
    std::fs::write(dir.path().join("accounts.conf"), tenancy.accounts_config()).unwrap();
    // The pod reads them as user 10200 (the Secret's 0440 with its fsGroup); here, by others.
    for (path, mode) in [
        (dir.path().to_path_buf(), 0o755),
        (dir.path().join("nats.conf"), 0o644),
        (dir.path().join("accounts.conf"), 0o644),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let name = format!(
        "sandmesh-k8s-nats-{}",
        messages::new_id().to_ascii_lowercase()
    );
    let mut cluster = start(dir.path(), &name);

    let monitors: Vec<String> = (0..NODES).map(|i| cluster.published(i, 8222)).collect();
    test_support::eventually("all three nodes healthy", Duration::from_secs(90), || {
        let monitors = monitors.clone();
        async move {
            for address in &monitors {
                if !healthy(address).await {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;

    // An R3 stream in the services' account, as SANDMESH_JS_REPLICAS=3 makes them.
    let admin = tenancy.credentials(Role::Admin).expect("admin");
    let server = format!("nats://{}", cluster.published(0, 4222));
    let client = test_support::connect(&admin.url(&server)).await;
    let js = jetstream::new(client);
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: "K8S_CHECK".into(),
            subjects: vec!["k8s.check.>".into()],
            num_replicas: NODES,
            ..Default::default()
        })
        .await
        .expect("an R3 stream on the three nodes");
    let info = stream.cached_info().clone();
    let cluster_info = info.cluster.expect("cluster info");
    assert_eq!(cluster_info.replicas.len() + 1, NODES, "{cluster_info:?}");
    js.publish("k8s.check.before", "1".into())
        .await
        .unwrap()
        .await
        .expect("an acknowledged write");

    // One node down (not the one the client uses): the other two keep the quorum.
    docker_ok(&["kill", cluster.container(2)]);
    test_support::eventually(
        "an acknowledged write with a node down",
        Duration::from_secs(60),
        || {
            let js = js.clone();
            async move {
                let ack = js.publish("k8s.check.after", "2".into()).await.ok()?;
                tokio::time::timeout(Duration::from_secs(5), ack)
                    .await
                    .ok()?
                    .ok()
            }
        },
    )
    .await;
    let mut stream = js.get_stream("K8S_CHECK").await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 2);

    let (network, nodes) = (cluster.network.clone(), cluster.nodes.clone());
    cluster.remove();
    for node in nodes {
        assert!(
            !docker(&["container", "inspect", &node]).status.success(),
            "{node} left"
        );
    }
    assert!(
        !docker(&["network", "inspect", &network]).status.success(),
        "{network} left"
    );
}
