//! [`NatsCluster`]: three real nats-servers clustered on loopback, for tests of what survives
//! the loss of a server. Each node has random ports (clients, routes, HTTP monitor), its own
//! JetStream storage directory, and the same accounts, users and permissions as
//! [`crate::NatsServer`] (sandmesh's shipped configuration), rendered by
//! `sandmesh_auth::ClusterNode` like a deployment's. A node can be killed (SIGKILL) and
//! restarted on its ports and storage; the cluster's health and its JetStream meta leader are
//! read from each node's monitoring endpoint (`/healthz`, `/jsz`, `/routez`).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use messages::tenancy::Tenant;
use messages::{ServiceName, Subjects};
use sandmesh_auth::{ClusterNode, Role, Tenancy};

use crate::{free_port, nats_server_binary, INSTALL_HINT};

/// The cluster's name on every node.
const CLUSTER_NAME: &str = "sandmesh-test";

struct Node {
    name: String,
    port: u16,
    monitor: u16,
    route: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Node {
    fn log_path(&self) -> PathBuf {
        self.dir.path().join("nats.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

/// A NATS cluster of real servers on loopback, killed and cleaned up on drop.
pub struct NatsCluster {
    bin: PathBuf,
    tenancy: Tenancy,
    nodes: Vec<Node>,
}

impl NatsCluster {
    /// Three nodes with the shipped configuration and the tenant `default`, healthy.
    pub fn start() -> Self {
        Self::start_with_tenancy(Tenancy::generate(&Subjects::default()), 3)
    }

    /// Three nodes with these tenants besides `default`.
    pub fn start_with_tenants(tenants: &[&str]) -> Self {
        let mut tenancy = Tenancy::generate(&Subjects::default());
        for t in tenants {
            tenancy.add_tenant(&Tenant::new(*t).expect("a valid tenant name"));
        }
        Self::start_with_tenancy(tenancy, 3)
    }

    /// `size` nodes for these accounts and users; returns once the cluster is healthy.
    pub fn start_with_tenancy(tenancy: Tenancy, size: usize) -> Self {
        assert!(
            size >= 2,
            "a cluster of one is a single server: use NatsServer"
        );
        let nodes = (0..size)
            .map(|i| Node {
                name: format!("n{}", i + 1),
                port: free_port(),
                monitor: free_port(),
                route: free_port(),
                dir: tempfile::tempdir().expect("temp dir"),
                child: None,
            })
            .collect();
        let mut cluster = Self {
            bin: nats_server_binary(),
            tenancy,
            nodes,
        };
        // All at once: each node keeps dialling its routes until the others listen.
        for i in 0..size {
            cluster.spawn(i);
        }
        for i in 0..size {
            cluster.wait_ready(i);
        }
        cluster.wait_healthy_blocking(Duration::from_secs(60));
        cluster
    }

    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Every node's client URL, comma-separated, without credentials.
    pub fn plain_url(&self) -> String {
        let urls: Vec<String> = (0..self.size()).map(|i| self.node_url(i)).collect();
        urls.join(",")
    }

    /// Node `i`'s client URL, without credentials.
    pub fn node_url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].port)
    }

    /// The admin's URL listing every node (see [`crate::NatsServer::url`]).
    pub fn url(&self) -> String {
        self.url_as(Role::Admin)
    }

    /// A service's URL listing every node.
    pub fn service_url(&self, service: ServiceName) -> String {
        self.url_as(Role::Service(service))
    }

    /// The URL of the agent user of `tenant`, listing every node.
    pub fn agent_url(&self, tenant: &str) -> String {
        let tenant = Tenant::new(tenant).expect("a valid tenant name");
        self.url_as(Role::Agent(&tenant))
    }

    /// The URL of operator `user`, listing every node.
    pub fn operator_url(&self, user: &str) -> String {
        self.url_as(Role::Operator(user))
    }

    fn url_as(&self, role: Role<'_>) -> String {
        let creds = self
            .tenancy
            .credentials(role)
            .unwrap_or_else(|| panic!("no credentials for {role:?}"));
        let urls: Vec<String> = (0..self.size())
            .map(|i| creds.url(&self.node_url(i)))
            .collect();
        urls.join(",")
    }

    pub fn tenancy(&self) -> &Tenancy {
        &self.tenancy
    }

    /// Node `i`'s server name (`n1`, `n2`, …), as JetStream names its peers.
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// Node `i`'s log so far (for failure messages).
    pub fn log(&self, i: usize) -> String {
        self.nodes[i].log()
    }

    fn config(&self, i: usize) -> String {
        let node = &self.nodes[i];
        ClusterNode {
            server_name: node.name.clone(),
            cluster_name: CLUSTER_NAME.into(),
            listen: format!("127.0.0.1:{}", node.port),
            monitor: format!("127.0.0.1:{}", node.monitor),
            cluster_listen: format!("127.0.0.1:{}", node.route),
            routes: self
                .nodes
                .iter()
                .filter(|other| other.name != node.name)
                .map(|other| format!("nats-route://127.0.0.1:{}", other.route))
                .collect(),
            store_dir: node.dir.path().join("js").display().to_string(),
            accounts: self.tenancy.accounts_config(),
        }
        .config()
    }

    fn spawn(&mut self, i: usize) {
        let conf = self.config(i);
        let node = &mut self.nodes[i];
        let conf_path = node.dir.path().join("nats.conf");
        std::fs::write(&conf_path, conf).expect("write nats.conf");
        let _ = std::fs::remove_file(node.log_path());
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&conf_path)
            .arg("-l")
            .arg(node.log_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {INSTALL_HINT}", self.bin.display()));
        node.child = Some(child);
    }

    fn wait_ready(&mut self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let node = &mut self.nodes[i];
        loop {
            let log = node.log();
            if log.contains("Server is ready") {
                return;
            }
            if let Some(child) = node.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    // Read again: the reason is the last line written before the exit.
                    let log = node.log();
                    panic!(
                        "nats-server {} exited ({status}) before it was ready:\n{err}\n{log}",
                        node.name
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "nats-server {} did not become ready within 20 s:\n{log}",
                node.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills node `i` with SIGKILL: as abrupt as a crash or a lost machine.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `i` again on its ports with its JetStream storage (it must be down), and
    /// returns once it accepts clients; [`Self::wait_healthy`] tells when it has caught up.
    pub fn restart(&mut self, i: usize) {
        assert!(!self.is_running(i), "node {i} is running; kill it first");
        self.spawn(i);
        self.wait_ready(i);
    }

    /// The index of the JetStream meta leader, as the running nodes report it.
    pub fn meta_leader(&self) -> Option<usize> {
        let name = self.running().find_map(|i| {
            let jsz = self.monitor(i, "/jsz")?;
            jsz["meta_cluster"]["leader"]
                .as_str()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
        })?;
        self.nodes.iter().position(|n| n.name == name)
    }

    /// The names of the client connections node `i` holds now (`/connz`): which services it
    /// serves (the kit names a connection `<service>-<instance>`).
    pub fn connections(&self, i: usize) -> Vec<String> {
        let Some(connz) = self.monitor(i, "/connz?limit=4096") else {
            return Vec::new();
        };
        connz["connections"]
            .as_array()
            .map(|conns| {
                conns
                    .iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.size()).filter(|i| self.is_running(*i))
    }

    /// `Ok` when every running node routes to every other running node, they agree on one
    /// meta leader, and each reports itself healthy (`/healthz`: JetStream current, every
    /// stream and consumer it hosts caught up); otherwise what is not yet so.
    pub fn health(&self) -> Result<(), String> {
        let running: Vec<usize> = self.running().collect();
        let mut leaders = BTreeSet::new();
        for &i in &running {
            let name = &self.nodes[i].name;
            let routez = self
                .monitor(i, "/routez")
                .ok_or_else(|| format!("{name}: /routez does not answer"))?;
            let peers: BTreeSet<&str> = routez["routes"]
                .as_array()
                .map(|routes| {
                    routes
                        .iter()
                        .filter_map(|r| r["remote_name"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            for &j in &running {
                let other = self.nodes[j].name.as_str();
                if j != i && !peers.contains(other) {
                    return Err(format!("{name} has no route to {other} yet"));
                }
            }
            let jsz = self
                .monitor(i, "/jsz")
                .ok_or_else(|| format!("{name}: /jsz does not answer"))?;
            match jsz["meta_cluster"]["leader"].as_str() {
                Some(l) if !l.is_empty() => leaders.insert(l.to_string()),
                _ => return Err(format!("{name} knows no meta leader")),
            };
            let (status, body) = http_get(self.nodes[i].monitor, "/healthz")
                .ok_or_else(|| format!("{name}: /healthz does not answer"))?;
            if status != 200 {
                return Err(format!("{name} is not healthy yet: {body}"));
            }
        }
        if leaders.len() != 1 {
            return Err(format!(
                "the nodes disagree on the meta leader: {leaders:?}"
            ));
        }
        // Survivors name a killed leader until they notice it is gone.
        let leader = leaders.pop_first().unwrap_or_default();
        match running.iter().any(|&i| self.nodes[i].name == leader) {
            true => Ok(()),
            false => Err(format!("the meta leader {leader} is down; no new one yet")),
        }
    }

    /// Waits, at most `limit`, until [`Self::health`] is `Ok`; panics with the last reason.
    pub async fn wait_healthy(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let last = match self.health() {
                Ok(()) => return,
                Err(why) => why,
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cluster did not become healthy within {limit:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn wait_healthy_blocking(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let last = match self.health() {
                Ok(()) => return,
                Err(why) => why,
            };
            assert!(
                Instant::now() < deadline,
                "the cluster did not become healthy within {limit:?}: {last}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Node `i`'s monitoring document at `path`, parsed.
    fn monitor(&self, i: usize, path: &str) -> Option<serde_json::Value> {
        let (status, body) = http_get(self.nodes[i].monitor, path)?;
        (status == 200).then_some(())?;
        serde_json::from_str(&body).ok()
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for node in &self.nodes {
                let refused: Vec<String> = node
                    .log()
                    .lines()
                    .filter(|l| l.contains("[ERR]") || l.contains("Violation"))
                    .map(str::to_string)
                    .collect();
                if !refused.is_empty() {
                    eprintln!("nats-server {} refused:\n{}", node.name, refused.join("\n"));
                }
            }
        }
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// A GET on a loopback monitoring port: `(status, body)`, or `None` when nothing answers in a
/// second. HTTP/1.0, so the server closes the connection after the body.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let timeout = Duration::from_secs(1);
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cluster_survives_the_loss_of_its_meta_leader() {
        let mut cluster = NatsCluster::start();
        assert_eq!(cluster.size(), 3);
        let (plain, creds) = sandmesh_auth::split_url(&cluster.url());
        assert_eq!(plain, cluster.plain_url());
        assert_eq!(creds.expect("credentials").user, "admin");
        let leader = cluster.meta_leader().expect("a meta leader");
        let client = crate::connect(&cluster.url()).await;
        let js = async_nats::jetstream::new(client);
        // A cluster just elected its meta leader may time a first create out on a loaded
        // machine; creating the same bucket again is idempotent.
        let kv = crate::eventually("an R3 bucket", Duration::from_secs(60), || {
            let js = js.clone();
            async move {
                js.create_key_value(async_nats::jetstream::kv::Config {
                    bucket: "survivor".into(),
                    num_replicas: 3,
                    ..Default::default()
                })
                .await
                .ok()
            }
        })
        .await;
        kv.put("k", "before".into()).await.expect("put");

        cluster.kill(leader);
        assert!(!cluster.is_running(leader));
        cluster.wait_healthy(Duration::from_secs(60)).await;
        let new_leader = cluster.meta_leader().expect("a new meta leader");
        assert_ne!(new_leader, leader);
        let value = crate::eventually("the value after the loss", Duration::from_secs(60), || {
            let kv = kv.clone();
            async move { kv.get("k").await.ok().flatten() }
        })
        .await;
        assert_eq!(&value[..], b"before");

        cluster.restart(leader);
        cluster.wait_healthy(Duration::from_secs(60)).await;
        assert!(cluster.is_running(leader));
        assert!(cluster.health().is_ok());
    }
}
