//! The burst invariant, "nothing lost, nothing doubled": the ids JetStream acknowledged must be
//! exactly the ids with a stored result, each stored once.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

/// What was compared and what did not match. Id lists are capped so a bad run stays readable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdCheck {
    pub acked: u64,
    pub results_distinct: u64,
    /// Stored result messages (the results stream's sequence advance over the run).
    pub results_stored: u64,
    /// Acked ids without a result.
    pub lost: u64,
    /// Ids seen in more than one stored result message, plus stored messages beyond one per id.
    pub duplicated: u64,
    /// Results for ids that were never acked (another client, or a bug).
    pub unexpected: u64,
    pub lost_sample: Vec<String>,
    pub duplicated_sample: Vec<String>,
    pub unexpected_sample: Vec<String>,
}

const SAMPLE: usize = 10;

impl IdCheck {
    /// `acked`: ids whose publish JetStream acknowledged (not as a duplicate);
    /// `observed`: the execution id of every stored result message read back, in order;
    /// `stored_messages`: how many result messages the stream took in over the run.
    pub fn compute(acked: &[String], observed: &[String], stored_messages: u64) -> Self {
        let acked_set: BTreeSet<&str> = acked.iter().map(String::as_str).collect();
        let mut seen: HashMap<&str, u64> = HashMap::new();
        for id in observed {
            *seen.entry(id.as_str()).or_default() += 1;
        }
        let lost: Vec<String> = acked_set
            .iter()
            .filter(|id| !seen.contains_key(**id))
            .map(|s| s.to_string())
            .collect();
        let mut doubled: Vec<String> = seen
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| id.to_string())
            .collect();
        doubled.sort();
        let mut unexpected: Vec<String> = seen
            .keys()
            .filter(|id| !acked_set.contains(**id))
            .map(|s| s.to_string())
            .collect();
        unexpected.sort();
        let extra_reads: u64 = seen.values().map(|n| n.saturating_sub(1)).sum();
        // A second store of one id replaces the first (one message per subject is kept), so a
        // reader may never see it; the stream's sequence still counts it.
        let extra_stored = stored_messages.saturating_sub(seen.len() as u64);
        Self {
            acked: acked_set.len() as u64,
            results_distinct: seen.len() as u64,
            results_stored: stored_messages,
            lost: lost.len() as u64,
            duplicated: extra_reads.max(extra_stored),
            unexpected: unexpected.len() as u64,
            lost_sample: lost.into_iter().take(SAMPLE).collect(),
            duplicated_sample: doubled.into_iter().take(SAMPLE).collect(),
            unexpected_sample: unexpected.into_iter().take(SAMPLE).collect(),
        }
    }

    pub fn passed(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.unexpected == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exact_match_passes() {
        let c = IdCheck::compute(&ids(&["a", "b", "c"]), &ids(&["c", "a", "b"]), 3);
        assert!(c.passed(), "{c:?}");
        assert_eq!((c.acked, c.results_distinct, c.results_stored), (3, 3, 3));
    }

    #[test]
    fn a_missing_result_is_lost() {
        let c = IdCheck::compute(&ids(&["a", "b", "c"]), &ids(&["a", "c"]), 2);
        assert!(!c.passed());
        assert_eq!(c.lost, 1);
        assert_eq!(c.lost_sample, ids(&["b"]));
        assert_eq!(c.duplicated, 0);
    }

    #[test]
    fn a_result_read_twice_is_duplicated() {
        let c = IdCheck::compute(&ids(&["a", "b"]), &ids(&["a", "b", "a"]), 3);
        assert!(!c.passed());
        assert_eq!(c.duplicated, 1);
        assert_eq!(c.duplicated_sample, ids(&["a"]));
    }

    #[test]
    fn a_replaced_result_is_caught_by_the_stream_count() {
        // The reader saw each id once, but the stream took in one message more.
        let c = IdCheck::compute(&ids(&["a", "b"]), &ids(&["a", "b"]), 3);
        assert_eq!(c.duplicated, 1);
        assert!(!c.passed());
    }

    #[test]
    fn a_result_nobody_asked_for_is_unexpected() {
        let c = IdCheck::compute(&ids(&["a"]), &ids(&["a", "z"]), 2);
        assert_eq!(c.unexpected, 1);
        assert_eq!(c.unexpected_sample, ids(&["z"]));
        assert!(!c.passed());
    }

    #[test]
    fn samples_are_capped() {
        let acked: Vec<String> = (0..100).map(|i| format!("id{i:03}")).collect();
        let c = IdCheck::compute(&acked, &[], 0);
        assert_eq!(c.lost, 100);
        assert_eq!(c.lost_sample.len(), SAMPLE);
    }
}
