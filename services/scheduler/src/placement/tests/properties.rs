//! Property tests of `choose` over arbitrary node tables.

use proptest::prelude::{any, prop_assert, prop_assert_eq, prop_oneof, proptest, Just};
// `Strategy` is the placement strategy here; proptest's is a generator.
use proptest::strategy::Strategy as Gen;
use proptest::test_runner::Config as ProptestConfig;

use super::*;

/// A metric value as a heartbeat may carry it: plausible, zero, negative or not finite.
fn value() -> impl Gen<Value = f64> {
    prop_oneof![
        4 => 0.0..64.0f64,
        4 => 0.0..1.0e10f64,
        1 => Just(0.0),
        1 => Just(-1.0),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
    ]
}

fn metrics() -> impl Gen<Value = BTreeMap<String, f64>> {
    let names = [
        metric::CPU_TOTAL,
        metric::CPU_USAGE_PERCENT,
        metric::MEMORY_TOTAL_BYTES,
        metric::MEMORY_USAGE_BYTES,
        metric::SESSION_COUNT,
    ];
    proptest::collection::vec(proptest::option::of(value()), names.len()).prop_map(move |values| {
        let named = names.iter().zip(values);
        named
            .filter_map(|(n, v)| Some((n.to_string(), v?)))
            .collect()
    })
}

/// Up to 8 nodes with distinct ids, some full, some with resource metrics; and which
/// of them the caller excludes.
fn table() -> impl Gen<Value = (Vec<NodeView>, Vec<bool>)> {
    let one = (0u32..8, 0u32..12, metrics());
    proptest::collection::vec((one, any::<bool>()), 0..8).prop_map(|rows| {
        rows.into_iter()
            .enumerate()
            .map(|(i, ((capacity, load, metrics), excluded))| {
                let id = format!("n{i}");
                let n = NodeView {
                    id,
                    capacity,
                    load,
                    metrics,
                    backends: vec![messages::executor::Backend::Docker],
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
                !n.is_full()
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
            .filter(|n| !n.is_full())
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
}
