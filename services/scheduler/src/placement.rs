//! Placement strategies: which executor node takes an execution. Pure
//! functions over a snapshot of the node table, so the `Registry` actor stays small and the
//! choices are testable without NATS.

use std::str::FromStr;

use std::collections::{BTreeMap, BTreeSet};

use messages::executor::Backend;
use messages::heartbeat::Resources;
use messages::slot_share::{SlotShares, NO_TENANT};
use messages::tenancy::Tenant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Each node in turn.
    RoundRobin,
    /// The node with the least work relative to its capacity.
    LeastLoaded,
    /// The node with the most free CPU and memory that still fits the request.
    ResourceAware,
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "round_robin" | "round-robin" => Ok(Strategy::RoundRobin),
            "least_loaded" | "least-loaded" => Ok(Strategy::LeastLoaded),
            "resource_aware" | "resource-aware" => Ok(Strategy::ResourceAware),
            other => Err(format!(
                "unknown placement {other:?}; expected round_robin, least_loaded or resource_aware"
            )),
        }
    }
}

impl Strategy {
    pub const fn as_str(self) -> &'static str {
        match self {
            Strategy::RoundRobin => "round_robin",
            Strategy::LeastLoaded => "least_loaded",
            Strategy::ResourceAware => "resource_aware",
        }
    }
}

/// What placement knows about one executor node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeView {
    pub id: String,
    pub capacity: u32,
    /// Reported load plus work this scheduler sent since the last heartbeat.
    pub load: u32,
    /// The host's CPU and memory from the node's heartbeat; `None` from executors that do
    /// not report them.
    pub resources: Option<Resources>,
    /// The isolation backends the node offers.
    pub backends: Vec<Backend>,
    /// The node's run slots held per tenant, from its heartbeat.
    pub held: BTreeMap<String, u32>,
}

impl NodeView {
    pub fn offers(&self, backend: Backend) -> bool {
        self.backends.contains(&backend)
    }

    /// Whether the node would take a run of `tenant` now, by the rule it admits by (as far as
    /// its last heartbeat and this scheduler's own work tell; the node has the last word).
    fn takes(&self, tenant: Option<&Tenant>) -> bool {
        let none = BTreeSet::new();
        let shares = SlotShares {
            capacity: self.capacity,
            held: &self.held,
            waiting: &none,
        };
        self.capacity == 0 || shares.admits(self.load, tenant.map_or(NO_TENANT, Tenant::as_str))
    }

    fn load_ratio(&self) -> f64 {
        if self.capacity == 0 {
            f64::from(self.load)
        } else {
            f64::from(self.load) / f64::from(self.capacity)
        }
    }

    /// Resources that can be scored.
    fn usable_resources(&self) -> Option<Resources> {
        self.resources.filter(Resources::is_usable)
    }
}

/// What one execution needs, and whose it is.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Requirements {
    pub cpus: f64,
    pub memory_mb: u64,
    /// Only nodes offering this backend qualify.
    pub backend: Backend,
    /// The tenant it runs for: a full node still takes the run of a tenant under its share
    /// of the node's slots ([`SlotShares`]).
    pub tenant: Option<Tenant>,
}

/// The chosen node, with why (recorded in the `placed` audit event).
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub node: String,
    pub score: f64,
    pub reason: String,
}

/// The resource score: free CPU 40 %, free memory 40 %, little work 20 %; zero when
/// the request does not fit (too few CPUs in all, or too little free memory). A node that
/// reports no resources scores on load alone (and its decision says so).
fn resource_score(node: &NodeView, req: &Requirements) -> f64 {
    let load_score = 1.0 / (f64::from(node.load) + 1.0);
    let Some(r) = node.usable_resources() else {
        return (1.0 - node.load_ratio()).max(0.0) * 0.8 + load_score * 0.2;
    };
    // CPU is compressible: a node busy right now still fits (its capacity bounds the
    // concurrency) and only scores lower; without this, a small host under load refused
    // every new session. Memory is not compressible.
    let needed_mem = req.memory_mb.saturating_mul(1024 * 1024);
    if r.cpus < req.cpus || r.memory_free_bytes() < needed_mem {
        return 0.0;
    }
    let mem_free = r.memory_free_bytes() as f64 / r.memory_total_bytes as f64;
    r.cpus_free() / r.cpus * 0.4 + mem_free * 0.4 + load_score * 0.2
}

/// Why a resource-aware choice scored as it did, for the `placed` audit event.
fn resource_reason(node: &NodeView, score: f64) -> String {
    match node.usable_resources() {
        Some(r) => format!(
            "resource_score: {score:.2} ({:.1} of {} CPUs free, {} MiB of {} MiB memory free)",
            r.cpus_free(),
            r.cpus,
            r.memory_free_bytes() >> 20,
            r.memory_total_bytes >> 20,
        ),
        None => format!(
            "resource_score: {score:.2} by load alone ({}/{}): the node reports no resources",
            node.load, node.capacity
        ),
    }
}

/// Picks a node. Full nodes (load ≥ capacity) are never chosen; `None` means nobody fits.
/// `cursor` is the round-robin position, advanced on each round-robin choice.
pub fn choose(
    strategy: Strategy,
    nodes: &[NodeView],
    req: &Requirements,
    cursor: &mut usize,
) -> Option<Decision> {
    let mut open: Vec<&NodeView> = nodes
        .iter()
        .filter(|n| n.takes(req.tenant.as_ref()) && n.offers(req.backend))
        .collect();
    // A stable order so round-robin visits each node in turn and ties break the same way.
    open.sort_by(|a, b| a.id.cmp(&b.id));
    if open.is_empty() {
        return None;
    }
    match strategy {
        Strategy::RoundRobin => {
            let node = open[*cursor % open.len()];
            *cursor = cursor.wrapping_add(1);
            Some(Decision {
                node: node.id.clone(),
                score: 1.0,
                reason: "round_robin".into(),
            })
        }
        Strategy::LeastLoaded => {
            let node = open
                .iter()
                .min_by(|a, b| a.load_ratio().total_cmp(&b.load_ratio()))?;
            Some(Decision {
                node: node.id.clone(),
                score: 1.0 / (f64::from(node.load) + 1.0),
                reason: format!("least_loaded: {}/{}", node.load, node.capacity),
            })
        }
        Strategy::ResourceAware => {
            let (node, score) = open
                .iter()
                .map(|n| (*n, resource_score(n, req)))
                .filter(|(_, s)| *s > 0.0)
                .max_by(|a, b| a.1.total_cmp(&b.1))?;
            Some(Decision {
                node: node.id.clone(),
                score,
                reason: resource_reason(node, score),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, capacity: u32, load: u32) -> NodeView {
        NodeView {
            id: id.into(),
            capacity,
            load,
            resources: None,
            backends: vec![Backend::Docker],
            held: BTreeMap::new(),
        }
    }

    fn with_resources(
        mut n: NodeView,
        cpus: f64,
        cpu_pct: f64,
        mem_gb: f64,
        used_gb: f64,
    ) -> NodeView {
        let gb = 1024.0 * 1024.0 * 1024.0;
        n.resources = Some(Resources {
            cpus,
            cpu_usage_percent: cpu_pct,
            memory_total_bytes: (mem_gb * gb) as u64,
            memory_used_bytes: (used_gb * gb) as u64,
        });
        n
    }

    const REQ: Requirements = Requirements {
        cpus: 1.0,
        memory_mb: 256,
        backend: Backend::Docker,
        tenant: None,
    };

    #[test]
    fn only_nodes_offering_the_backend_qualify() {
        let mut light = node("light", 16, 0);
        light.backends = vec![Backend::Bwrap];
        let nodes = [node("docker", 8, 7), light];
        for strategy in [
            Strategy::RoundRobin,
            Strategy::LeastLoaded,
            Strategy::ResourceAware,
        ] {
            let mut cursor = 0;
            let d = choose(strategy, &nodes, &REQ, &mut cursor).unwrap();
            assert_eq!(
                d.node, "docker",
                "{strategy:?}: Docker work never lands on bwrap"
            );
            let bwrap = Requirements {
                backend: Backend::Bwrap,
                ..REQ
            };
            let d = choose(strategy, &nodes, &bwrap, &mut cursor).unwrap();
            assert_eq!(d.node, "light", "{strategy:?}");
            assert!(choose(strategy, &nodes[..1], &bwrap, &mut cursor).is_none());
        }
    }

    #[test]
    fn round_robin_visits_every_open_node_in_turn() {
        let nodes = [node("b", 4, 0), node("a", 4, 0), node("c", 4, 4)];
        let mut cursor = 0;
        let picks: Vec<String> = (0..4)
            .map(|_| {
                choose(Strategy::RoundRobin, &nodes, &REQ, &mut cursor)
                    .unwrap()
                    .node
            })
            .collect();
        assert_eq!(picks, ["a", "b", "a", "b"]);
    }

    #[test]
    fn least_loaded_compares_load_to_capacity() {
        let nodes = [node("a", 2, 1), node("b", 10, 2), node("c", 4, 4)];
        let d = choose(Strategy::LeastLoaded, &nodes, &REQ, &mut 0).unwrap();
        assert_eq!(d.node, "b");
    }

    #[test]
    fn resource_aware_prefers_free_resources_and_skips_nodes_that_do_not_fit() {
        let busy = with_resources(node("busy", 8, 1), 4.0, 90.0, 8.0, 7.0);
        let idle = with_resources(node("idle", 8, 1), 4.0, 10.0, 8.0, 1.0);
        let tiny = with_resources(node("tiny", 8, 0), 0.5, 0.0, 8.0, 0.0);
        let nodes = [busy.clone(), idle, tiny.clone()];
        assert_eq!(
            choose(Strategy::ResourceAware, &nodes, &REQ, &mut 0)
                .unwrap()
                .node,
            "idle"
        );
        // Only nodes that cannot fit the request: nobody is chosen.
        let full = with_resources(node("full", 8, 0), 4.0, 100.0, 8.0, 8.0);
        assert!(choose(Strategy::ResourceAware, &[tiny.clone(), full], &REQ, &mut 0).is_none());
        // A node whose CPUs are all busy right now but has memory free still takes work.
        let saturated = with_resources(node("saturated", 8, 2), 2.0, 100.0, 8.0, 1.0);
        let d = choose(Strategy::ResourceAware, &[tiny, saturated], &REQ, &mut 0);
        assert_eq!(d.unwrap().node, "saturated");
        // Without resource figures the score falls back to load, and the reason says so.
        let nodes = [node("x", 4, 3), node("y", 4, 1)];
        let d = choose(Strategy::ResourceAware, &nodes, &REQ, &mut 0).unwrap();
        assert_eq!(d.node, "y");
        assert!(d.reason.contains("reports no resources"), "{}", d.reason);
    }

    #[test]
    fn the_reason_names_the_figures_scored_and_memory_is_never_overcommitted() {
        let reporting = with_resources(node("reporting", 8, 2), 8.0, 10.0, 16.0, 2.0);
        let d = choose(Strategy::ResourceAware, &[reporting], &REQ, &mut 0).unwrap();
        assert!(
            d.reason
                .contains("7.2 of 8 CPUs free, 14336 MiB of 16384 MiB"),
            "{}",
            d.reason
        );
        // A request bigger than the host's free memory never lands there, however idle.
        let big = Requirements {
            memory_mb: 15 * 1024,
            ..REQ
        };
        let tight = with_resources(node("tight", 8, 0), 8.0, 0.0, 16.0, 2.0);
        assert!(choose(Strategy::ResourceAware, &[tight], &big, &mut 0).is_none());
    }

    #[test]
    fn full_or_absent_nodes_give_no_decision() {
        for s in [
            Strategy::RoundRobin,
            Strategy::LeastLoaded,
            Strategy::ResourceAware,
        ] {
            assert!(choose(s, &[], &REQ, &mut 0).is_none());
            assert!(choose(s, &[node("a", 1, 1)], &REQ, &mut 0).is_none());
        }
    }

    const STRATEGIES: [Strategy; 3] = [
        Strategy::RoundRobin,
        Strategy::LeastLoaded,
        Strategy::ResourceAware,
    ];

    mod properties;
}
