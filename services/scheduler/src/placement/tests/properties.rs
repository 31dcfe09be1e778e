//! Property tests of `choose` over arbitrary node tables.

use proptest::prelude::{any, prop_assert, prop_assert_eq, prop_oneof, proptest, Just};
// `Strategy` is the placement strategy here; proptest's is a generator.
use proptest::strategy::Strategy as Gen;
use proptest::test_runner::Config as ProptestConfig;

use super::*;

/// A figure as a heartbeat may carry it: plausible, zero, negative or not finite.
fn value() -> impl Gen<Value = f64> {
    prop_oneof![
        4 => 0.0..64.0f64,
        4 => 0.0..100.0f64,
        1 => Just(0.0),
        1 => Just(-1.0),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
    ]
}

/// Resources as executors report them, or none (an older executor).
fn resources() -> impl Gen<Value = Option<Resources>> {
    let bytes = prop_oneof![Just(0u64), 0u64..(64u64 << 30), Just(u64::MAX)];
    proptest::option::of((value(), value(), bytes.clone(), bytes)).prop_map(|r| {
        r.map(
            |(cpus, cpu_usage_percent, memory_total_bytes, memory_used_bytes)| Resources {
                cpus,
                cpu_usage_percent,
                memory_total_bytes,
                memory_used_bytes,
            },
        )
    })
}

/// Up to 8 nodes with distinct ids, some full, some reporting resources; and which
/// of them the caller excludes.
fn table() -> impl Gen<Value = (Vec<NodeView>, Vec<bool>)> {
    let one = (0u32..8, 0u32..12, resources());
    proptest::collection::vec((one, any::<bool>()), 0..8).prop_map(|rows| {
        rows.into_iter()
            .enumerate()
            .map(|(i, ((capacity, load, resources), excluded))| {
                let id = format!("n{i}");
                let n = NodeView {
                    id,
                    capacity,
                    load,
                    resources,
                    backends: vec![messages::executor::Backend::Docker],
                    held: Default::default(),
                };
                (n, excluded)
            })
            .unzip()
    })
}

fn requirements() -> impl Gen<Value = Requirements> {
    (0.0..8.0f64, 0u64..16_384).prop_map(|(cpus, memory_mb)| Requirements {
        cpus,
        memory_mb,
        ..Default::default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The registry hands `choose` the table without the excluded nodes: whatever the
    /// strategy, the pick is one of those offered, open, and (resource-aware) fits.
    #[test]
    fn never_picks_an_excluded_full_or_unfit_node(
        (nodes, excluded) in table(),
        req in requirements(),
        cursor in any::<usize>(),
    ) {
        let offered: Vec<NodeView> = nodes
            .iter()
            .zip(&excluded)
            .filter(|(_, x)| !**x)
            .map(|(n, _)| n.clone())
            .collect();
        for s in STRATEGIES {
            let picked = choose(s, &offered, &req, &mut cursor.clone());
            let fits = |n: &NodeView| {
                n.takes(None)
                    && (s != Strategy::ResourceAware || resource_score(n, &req) > 0.0)
            };
            match picked {
                Some(d) => {
                    let n = offered.iter().find(|n| n.id == d.node);
                    let n = n.unwrap_or_else(|| panic!("{s:?} picked {} not offered", d.node));
                    prop_assert!(fits(n), "{:?} picked {:?}", s, n);
                }
                None => prop_assert!(!offered.iter().any(fits), "{:?} found nothing", s),
            }
        }
    }

    #[test]
    fn least_loaded_picks_a_minimal_load_ratio(
        (nodes, _) in table(),
        req in requirements(),
    ) {
        let best = nodes
            .iter()
            .filter(|n| n.takes(None))
            .map(NodeView::load_ratio)
            .min_by(f64::total_cmp);
        let picked = choose(Strategy::LeastLoaded, &nodes, &req, &mut 0);
        let ratio = picked.map(|d| nodes.iter().find(|n| n.id == d.node).unwrap().load_ratio());
        prop_assert_eq!(ratio, best);
    }

    /// Equal nodes share the work evenly: with each pick counted on its node (as the
    /// registry does), `k` nodes given `k × rounds` executions take `rounds` each.
    #[test]
    fn equal_nodes_share_the_work_evenly(
        k in 1usize..6,
        rounds in 1u32..5,
        load in 0u32..4,
        cursor in any::<usize>(),
    ) {
        for s in STRATEGIES {
            let capacity = load + rounds;
            let mut nodes: Vec<NodeView> =
                (0..k).map(|i| node(&format!("n{i}"), capacity, load)).collect();
            let mut cursor = cursor;
            for _ in 0..k * rounds as usize {
                let d = choose(s, &nodes, &REQ, &mut cursor);
                let d = d.unwrap_or_else(|| panic!("{s:?}: room left, nothing picked"));
                nodes.iter_mut().find(|n| n.id == d.node).unwrap().load += 1;
            }
            let taken: Vec<u32> = nodes.iter().map(|n| n.load - load).collect();
            prop_assert_eq!(&taken, &vec![rounds; k], "{:?}", s);
            prop_assert!(choose(s, &nodes, &REQ, &mut cursor).is_none());
        }
    }

    /// Resource-aware placement takes a best-scoring open node: no open, fitting node
    /// scores higher than the one chosen.
    #[test]
    fn resource_aware_picks_a_best_score(
        (nodes, _) in table(),
        req in requirements(),
    ) {
        let picked = choose(Strategy::ResourceAware, &nodes, &req, &mut 0);
        let best = nodes
            .iter()
            .filter(|n| n.takes(None))
            .map(|n| resource_score(n, &req))
            .filter(|s| *s > 0.0)
            .max_by(f64::total_cmp);
        prop_assert_eq!(picked.map(|d| d.score), best);
    }

    /// Freeing memory or CPU on a node never lowers its score, and never makes a request
    /// that fitted stop fitting.
    #[test]
    fn more_free_resources_never_score_lower(
        cpus in 1.0..64.0f64,
        busy in 0.0..100.0f64,
        less_busy in 0.0..100.0f64,
        total_gb in 1u64..64,
        used in 0.0..1.0f64,
        freed in 0.0..1.0f64,
        load in 0u32..8,
        req in requirements(),
    ) {
        let total = total_gb << 30;
        let used_bytes = (total as f64 * used) as u64;
        let before = Resources {
            cpus,
            cpu_usage_percent: busy,
            memory_total_bytes: total,
            memory_used_bytes: used_bytes,
        };
        let after = Resources {
            cpu_usage_percent: busy * less_busy / 100.0,
            memory_used_bytes: (used_bytes as f64 * (1.0 - freed)) as u64,
            ..before
        };
        let at = |r| NodeView { resources: Some(r), ..node("n", 8, load) };
        let (b, a) = (resource_score(&at(before), &req), resource_score(&at(after), &req));
        prop_assert!(a >= b, "{} < {} for {:?} -> {:?}", a, b, before, after);
    }
}
