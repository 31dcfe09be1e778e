//! The server configuration of one node of a NATS cluster: the single server's settings
//! (JetStream with `sync_interval: always`, `max_payload: 1MB`) plus a server name, a
//! monitoring port and the cluster block with routes to the other nodes. The accounts are the
//! same as on a single server ([`crate::Tenancy::accounts_config`]): every node must carry the
//! same ones, so a node either includes the shared accounts file or has it appended.

use std::fmt::Write as _;

/// Where one node listens and whom it routes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Unique in the cluster; JetStream names its peers by it.
    pub server_name: String,
    /// The cluster's name, the same on every node.
    pub cluster_name: String,
    /// `host:port` for clients.
    pub listen: String,
    /// `host:port` for the HTTP monitor (`/healthz`, `/jsz`, `/routez`).
    pub monitor: String,
    /// `host:port` for routes from the other nodes.
    pub cluster_listen: String,
    /// `nats-route://host:port` of every other node.
    pub routes: Vec<String>,
    /// The JetStream storage directory.
    pub store_dir: String,
    /// How the accounts get in: `include "accounts.conf"` for a deployment (the file is a
    /// secret, mounted beside this one), or the rendered `accounts { … }` block itself.
    pub accounts: String,
}

impl ClusterNode {
    /// The node's whole configuration file.
    pub fn config(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "server_name: {:?}", self.server_name);
        let _ = writeln!(out, "listen: {:?}", self.listen);
        let _ = writeln!(out, "http: {:?}", self.monitor);
        out.push_str("max_payload: 1MB\n");
        let _ = writeln!(
            out,
            "jetstream {{\n  store_dir: {:?}\n  sync_interval: always\n}}",
            self.store_dir
        );
        let _ = writeln!(
            out,
            "cluster {{\n  name: {:?}\n  listen: {:?}\n  routes: [",
            self.cluster_name, self.cluster_listen
        );
        for route in &self.routes {
            let _ = writeln!(out, "    {route:?}");
        }
        out.push_str("  ]\n}\n");
        out.push_str(&self.accounts);
        if !self.accounts.ends_with('\n') {
            out.push('\n');
        }
        out
    }
}

/// The nodes of a cluster whose node `i` is reached at `hosts[i]` with the same ports on each
/// (a deployment: one host name per node), accounts included from `accounts.conf`.
pub fn deployment_nodes(
    cluster_name: &str,
    hosts: &[&str],
    ports: (u16, u16, u16),
    store_dir: &str,
) -> Vec<ClusterNode> {
    let (client, monitor, route) = ports;
    hosts
        .iter()
        .enumerate()
        .map(|(i, host)| ClusterNode {
            server_name: host.to_string(),
            cluster_name: cluster_name.to_string(),
            listen: format!("0.0.0.0:{client}"),
            monitor: format!("0.0.0.0:{monitor}"),
            cluster_listen: format!("0.0.0.0:{route}"),
            routes: hosts
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, other)| format!("nats-route://{other}:{route}"))
                .collect(),
            store_dir: store_dir.to_string(),
            accounts: "include \"accounts.conf\"\n".to_string(),
        })
        .collect()
}

/// The server addresses of a comma-separated list (`nats://a:4222, nats://b:4222`), trimmed,
/// empty entries dropped: what a client connects to and fails over between.
pub fn servers(plain: &str) -> Vec<String> {
    plain
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_of_servers_split() {
        assert_eq!(
            servers("nats://a:1, nats://b:2,,"),
            vec!["nats://a:1".to_string(), "nats://b:2".to_string()]
        );
        assert!(servers(" , ").is_empty());
    }

    #[test]
    fn each_node_routes_to_the_others() {
        let nodes = deployment_nodes("sandmesh", &["n1", "n2", "n3"], (4222, 8222, 6222), "/d");
        assert_eq!(nodes.len(), 3);
        assert_eq!(
            nodes[1].routes,
            vec!["nats-route://n1:6222", "nats-route://n3:6222"]
        );
        let conf = nodes[0].config();
        assert!(conf.contains("server_name: \"n1\""), "{conf}");
        assert!(conf.contains("include \"accounts.conf\""), "{conf}");
        assert!(conf.contains("sync_interval: always"), "{conf}");
    }

    /// The shipped `deploy/nats/cluster/` files are these functions' output, so they cannot
    /// drift from what the tests run. `SANDMESH_WRITE_CLUSTER_CONFIGS=1` rewrites them.
    #[test]
    fn shipped_cluster_configs_are_current() {
        let write = std::env::var_os("SANDMESH_WRITE_CLUSTER_CONFIGS").is_some();
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats/cluster");
        let hosts = ["nats-1", "nats-2", "nats-3"];
        let nodes = deployment_nodes("sandmesh", &hosts, (4222, 8222, 6222), "/data/jetstream");
        for (host, node) in hosts.iter().zip(nodes) {
            let path = dir.join(format!("{host}.conf"));
            if write {
                std::fs::write(&path, node.config()).expect("write a cluster config");
            }
            let shipped = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(
                shipped,
                node.config(),
                "{} is stale; regenerate it (see deploy/nats/cluster/README.md)",
                path.display()
            );
        }
    }
}
