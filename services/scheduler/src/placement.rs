//! Placement strategies (seed 003 §2.1.2): which executor node takes an execution. Pure
//! functions over a snapshot of the node table, so the `Registry` actor stays small and the
//! choices are testable without NATS.

use std::collections::BTreeMap;
use std::str::FromStr;

use messages::executor::Backend;

/// Heartbeat metric names read by resource-aware placement (seed 003 §8 vocabulary).
pub mod metric {
    pub const CPU_TOTAL: &str = "runtime_cpu_total";
    pub const CPU_USAGE_PERCENT: &str = "runtime_cpu_usage_percent";
    pub const MEMORY_TOTAL_BYTES: &str = "runtime_memory_total_bytes";
    pub const MEMORY_USAGE_BYTES: &str = "runtime_memory_usage_bytes";
    pub const SESSION_COUNT: &str = "runtime_session_count";
    /// The docker-executor's name for the same gauge.
    pub const ACTIVE_SESSIONS: &str = "active_sessions";
}

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
    pub metrics: BTreeMap<String, f64>,
    /// The isolation backends the node offers.
    pub backends: Vec<Backend>,
}

impl NodeView {
    pub fn offers(&self, backend: Backend) -> bool {
        self.backends.contains(&backend)
    }

    fn is_full(&self) -> bool {
        self.capacity > 0 && self.load >= self.capacity
    }

    fn load_ratio(&self) -> f64 {
        if self.capacity == 0 {
            f64::from(self.load)
        } else {
            f64::from(self.load) / f64::from(self.capacity)
        }
    }

    fn metric(&self, name: &str) -> Option<f64> {
        self.metrics.get(name).copied().filter(|v| v.is_finite())
    }
}

/// What one execution needs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Requirements {
    pub cpus: f64,
    pub memory_mb: u64,
    /// Only nodes offering this backend qualify.
    pub backend: Backend,
}

/// The chosen node, with why (recorded in the `placed` audit event).
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub node: String,
    pub score: f64,
    pub reason: String,
}

/// Seed 003's resource score: free CPU 40 %, free memory 40 %, few sessions 20 %; zero when
/// the request does not fit (too few CPUs in all, or too little free memory). Nodes that report no resources score on load alone.
fn resource_score(node: &NodeView, req: &Requirements) -> f64 {
    let load_score = 1.0
        / (node
            .metric(metric::SESSION_COUNT)
            .unwrap_or(node.load as f64)
            + 1.0);
    let cpu = node.metric(metric::CPU_TOTAL).map(|total| {
        let used = total * node.metric(metric::CPU_USAGE_PERCENT).unwrap_or(0.0) / 100.0;
        (total, (total - used).max(0.0))
    });
    let mem = node.metric(metric::MEMORY_TOTAL_BYTES).map(|total| {
        let used = node.metric(metric::MEMORY_USAGE_BYTES).unwrap_or(0.0);
        (total, (total - used).max(0.0))
    });
    let needed_mem = req.memory_mb as f64 * 1024.0 * 1024.0;
    match (cpu, mem) {
        (Some((cpu_total, cpu_free)), Some((mem_total, mem_free)))
            if cpu_total > 0.0 && mem_total > 0.0 =>
        {
            // CPU is compressible: a node busy right now still fits (its capacity bounds the
            // concurrency) and only scores lower; without this, a small host under load
            // refused every new session. Memory is not compressible.
            if cpu_total < req.cpus || mem_free < needed_mem {
                return 0.0;
            }
            cpu_free / cpu_total * 0.4 + mem_free / mem_total * 0.4 + load_score * 0.2
        }
        _ => (1.0 - node.load_ratio()).max(0.0) * 0.8 + load_score * 0.2,
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
        .filter(|n| !n.is_full() && n.offers(req.backend))
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
                reason: format!("resource_score: {score:.2}"),
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
            metrics: BTreeMap::new(),
            backends: vec![Backend::Docker],
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
        n.metrics.insert(metric::CPU_TOTAL.into(), cpus);
        n.metrics.insert(metric::CPU_USAGE_PERCENT.into(), cpu_pct);
        n.metrics
            .insert(metric::MEMORY_TOTAL_BYTES.into(), mem_gb * gb);
        n.metrics
            .insert(metric::MEMORY_USAGE_BYTES.into(), used_gb * gb);
        n
    }

    const REQ: Requirements = Requirements {
        cpus: 1.0,
        memory_mb: 256,
        backend: Backend::Docker,
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
        // Without resource metrics the score falls back to load.
        let nodes = [node("x", 4, 3), node("y", 4, 1)];
        assert_eq!(
            choose(Strategy::ResourceAware, &nodes, &REQ, &mut 0)
                .unwrap()
                .node,
            "y"
        );
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
