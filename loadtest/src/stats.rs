//! Latency recording and summaries: one HdrHistogram of microseconds per measured series, plus
//! counts of outcomes by status.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// One hour in microseconds: nothing the loadtest waits for is longer, and anything longer is
/// clamped rather than dropped so it still counts.
const HIGHEST_US: u64 = 3_600_000_000;

/// Latencies of one series, in microseconds (3 significant digits: ±0.1 %).
#[derive(Debug, Clone)]
pub struct Latencies {
    hist: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("static histogram bounds"),
        }
    }
}

impl Latencies {
    pub fn record(&mut self, d: Duration) {
        self.record_us(d.as_micros().min(u128::from(u64::MAX)) as u64);
    }

    pub fn record_us(&mut self, us: u64) {
        self.hist.saturating_record(us.max(1));
    }

    pub fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides, so addition cannot fail; saturate rather than panic.
        if self.hist.add(&other.hist).is_err() {
            for v in other.hist.iter_recorded() {
                self.hist
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary::of(&self.hist)
    }
}

/// p50 / p90 / p99 / max of a series, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ms: f64,
    pub min_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

impl LatencySummary {
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            mean_ms: (h.mean()).round() / 1000.0,
            min_ms: ms(h.min()),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

/// Outcomes by name (`ok`, `timeout`, `429`, `transport`, ...), sorted for stable output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts(pub BTreeMap<String, u64>);

impl Counts {
    pub fn add(&mut self, key: &str) {
        *self.0.entry(key.to_string()).or_default() += 1;
    }

    pub fn add_n(&mut self, key: &str, n: u64) {
        *self.0.entry(key.to_string()).or_default() += n;
    }

    pub fn merge(&mut self, other: &Counts) {
        for (k, v) in &other.0 {
            self.add_n(k, *v);
        }
    }

    #[cfg(test)]
    pub fn get(&self, key: &str) -> u64 {
        self.0.get(key).copied().unwrap_or(0)
    }

    #[cfg(test)]
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// `ok=10 timeout=2`, the compact form of the human summary.
    pub fn compact(&self) -> String {
        if self.0.is_empty() {
            return "-".into();
        }
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `a / b`, or `None` when there is nothing to compare against.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite()).then(|| (a / b * 100.0).round() / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_a_uniform_series_has_the_expected_quantiles() {
        let mut l = Latencies::default();
        for ms in 1..=100u64 {
            l.record(Duration::from_millis(ms));
        }
        let s = l.summary();
        assert_eq!(s.count, 100);
        // 3 significant digits: values are exact to within 0.1 %.
        assert!((s.p50_ms - 50.0).abs() <= 0.05, "{s:?}");
        assert!((s.p90_ms - 90.0).abs() <= 0.09, "{s:?}");
        assert!((s.p99_ms - 99.0).abs() <= 0.1, "{s:?}");
        assert!((s.max_ms - 100.0).abs() <= 0.1, "{s:?}");
        assert!((s.min_ms - 1.0).abs() <= 0.001, "{s:?}");
        assert!((s.mean_ms - 50.5).abs() <= 0.1, "{s:?}");
    }

    #[test]
    fn empty_series_summarises_to_zeroes() {
        assert_eq!(Latencies::default().summary(), LatencySummary::default());
    }

    #[test]
    fn merging_adds_both_series() {
        let (mut a, mut b) = (Latencies::default(), Latencies::default());
        a.record_us(1_000);
        b.record_us(9_000);
        b.record_us(9_000);
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.count, 3);
        assert!((s.p50_ms - 9.0).abs() < 0.01, "{s:?}");
        assert!((s.min_ms - 1.0).abs() < 0.01, "{s:?}");
    }

    #[test]
    fn absurd_values_are_clamped_not_lost() {
        let mut l = Latencies::default();
        l.record(Duration::from_secs(10 * 3600));
        l.record_us(0);
        assert_eq!(l.len(), 2);
        assert!(l.summary().max_ms >= 3_599_000.0);
    }

    #[test]
    fn counts_merge_and_print_sorted() {
        let mut a = Counts::default();
        a.add("timeout");
        a.add("ok");
        let mut b = Counts::default();
        b.add_n("ok", 3);
        a.merge(&b);
        assert_eq!(a.get("ok"), 4);
        assert_eq!(a.get("missing"), 0);
        assert_eq!(a.total(), 5);
        assert_eq!(a.compact(), "ok=4 timeout=1");
        assert_eq!(Counts::default().compact(), "-");
    }

    #[test]
    fn ratio_needs_a_positive_denominator() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(1.0, 3.0), Some(0.33));
        assert_eq!(ratio(1.0, 0.0), None);
    }
}
