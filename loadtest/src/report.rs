//! The run's report: every measured series, the burst and mixed checks, memory, and the
//! targets judged against them. Written as JSON (`--json-out`) and as a short human summary.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::driver::Run;
use crate::ids::IdCheck;
use crate::rss::ProcessMemory;
use crate::stats::{ratio, Counts, LatencySummary};

/// Its report lives here, with the report's shape: the driver measures and knows nothing of
/// how a series is reported.
impl Run {
    pub fn report(&self, name: &str) -> SeriesReport {
        SeriesReport::new(name, self)
    }
}

/// One measured series: one scenario, one language / tier / mode, one concurrency.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SeriesReport {
    pub name: String,
    pub scenario: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// `sync` or `async` for executions; the operation for workspace series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Service instances serving the series (assess with one or two risk-assessors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<usize>,
    pub concurrency: usize,
    pub completed: u64,
    pub elapsed_s: f64,
    pub throughput_rps: f64,
    pub latency: LatencySummary,
    pub statuses: Counts,
    /// The first error message of each status that is not `ok`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub examples: BTreeMap<String, String>,
    /// End-to-end minus the executor's `timing.exec_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<LatencySummary>,
    /// The executor's own `timing.exec_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_time: Option<LatencySummary>,
    /// p50 of this series / p50 of `baseline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_vs_baseline: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
}

impl SeriesReport {
    pub fn new(name: &str, run: &Run) -> Self {
        let some = |l: &crate::stats::Latencies| (!l.is_empty()).then(|| l.summary());
        Self {
            name: name.to_string(),
            scenario: name.split('/').next().unwrap_or(name).to_string(),
            concurrency: run.concurrency,
            completed: run.completed,
            elapsed_s: (run.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            throughput_rps: (run.throughput() * 10.0).round() / 10.0,
            latency: run.latencies.summary(),
            statuses: run.statuses.clone(),
            examples: run.examples.clone(),
            overhead: some(&run.overhead),
            exec_time: some(&run.inner),
            ..Default::default()
        }
    }

    /// Did every operation end `ok`?
    pub fn all_ok(&self) -> bool {
        self.statuses.0.keys().all(|k| k == "ok")
    }

    pub fn tagged(
        mut self,
        language: Option<&str>,
        tier: Option<&str>,
        mode: Option<&str>,
    ) -> Self {
        self.language = language.map(str::to_string);
        self.tier = tier.map(str::to_string);
        self.mode = mode.map(str::to_string);
        self
    }
}

/// The burst scenario: N async jobs published at once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BurstReport {
    pub jobs: u64,
    pub tier: String,
    pub publish_s: f64,
    /// From the first publish until the last result was stored.
    pub all_stored_s: f64,
    pub results_per_s: f64,
    pub statuses: Counts,
    /// The first error message of each status that is not `ok`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub examples: BTreeMap<String, String>,
    pub check: IdCheck,
    /// The wait for results ended at its time limit rather than with every result in.
    pub timed_out: bool,
}

/// Containers left behind after the mixed scenario, by kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerCount {
    pub total: u64,
    pub warm: u64,
    pub session: u64,
    pub other: u64,
    /// Beyond the warm pool (and beyond the sessions still open, which the run closes).
    pub leaked: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MixedReport {
    /// Results by program kind, then by status.
    pub by_program: Vec<(String, Counts)>,
    pub containers_after: ContainerCount,
    pub warm_pool: u64,
}

/// Resident memory of one standalone service, idle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleMemory {
    pub service: String,
    pub rss_mb: f64,
    pub peak_mb: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<String>,
    /// `None`: not measured in this run.
    pub met: Option<bool>,
    #[serde(default)]
    pub note: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub kernel: String,
    pub docker: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub started_unix_ms: u64,
    pub command: String,
    pub machine: Machine,
    pub nats_url: String,
    pub spawned_mesh: bool,
    pub series: Vec<SeriesReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<BurstReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed: Option<MixedReport>,
    /// Peak RSS of each mesh process at the end of the run.
    pub memory: Vec<ProcessMemory>,
    pub idle_memory: Vec<IdleMemory>,
    pub targets: Vec<TargetCheck>,
    /// Scenarios that could not run to the end, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    /// The Prometheus scrape before and after the run (`--metrics-addr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<crate::metrics_check::MetricsCheck>,
}

impl Report {
    /// Sets every execution series' ratio to its floor of the same language and concurrency,
    /// measured in the same run: for a burst of new sessions the bare sandboxes started at once
    /// (`bare-sandboxes`), for every other execution the bare `docker exec` (`baseline`).
    pub fn attach_baselines(&mut self) {
        let floors: Vec<(String, Option<String>, usize, String, f64)> = self
            .series
            .iter()
            .filter(|s| {
                matches!(s.scenario.as_str(), "baseline" | "bare-sandboxes") && s.latency.count > 0
            })
            .map(|s| {
                (
                    s.scenario.clone(),
                    s.language.clone(),
                    s.concurrency,
                    s.name.clone(),
                    s.latency.p50_ms,
                )
            })
            .collect();
        for s in self
            .series
            .iter_mut()
            // A ratio of a series with failures would compare error replies with executions.
            .filter(|s| {
                let compared = matches!(
                    s.scenario.as_str(),
                    "exec" | "template" | "ephemeral-ready" | "http" | "sessions-burst"
                );
                // One burst's own first results, beside the same floor.
                let round = s.scenario.starts_with("sessions-burst-round")
                    && s.name.contains("/first-result/");
                (compared || round) && s.latency.count > 0 && s.all_ok()
            })
        {
            let floor = if s.scenario.starts_with("sessions-burst") {
                "bare-sandboxes"
            } else {
                "baseline"
            };
            let found = floors.iter().find(|(scenario, lang, c, _, _)| {
                scenario == floor && *lang == s.language && *c == s.concurrency
            });
            if let Some((_, _, _, name, p50)) = found {
                s.p50_vs_baseline = ratio(s.latency.p50_ms, *p50);
                s.baseline = Some(name.clone());
            }
        }
    }
}

#[cfg(test)]
pub mod testing {
    use super::*;

    pub fn series(
        name: &str,
        lang: &str,
        tier: Option<&str>,
        mode: Option<&str>,
        c: usize,
        p50: f64,
    ) -> SeriesReport {
        SeriesReport {
            name: name.into(),
            scenario: name.split('/').next().unwrap().into(),
            concurrency: c,
            latency: LatencySummary {
                count: 100,
                p50_ms: p50,
                ..Default::default()
            },
            ..Default::default()
        }
        .tagged(Some(lang), tier, mode)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::series;
    use super::*;

    #[test]
    fn exec_series_get_the_ratio_to_their_own_baseline() {
        let mut r = Report {
            series: vec![
                series("baseline/python/c1", "python", None, None, 1, 40.0),
                series("baseline/python/c4", "python", None, None, 4, 80.0),
                series(
                    "exec/python/ephemeral/sync/c1",
                    "python",
                    Some("ephemeral"),
                    Some("sync"),
                    1,
                    48.0,
                ),
                series(
                    "exec/python/session/sync/c4",
                    "python",
                    Some("session"),
                    Some("sync"),
                    4,
                    88.0,
                ),
                series(
                    "exec/shell/session/sync/c1",
                    "shell",
                    Some("session"),
                    Some("sync"),
                    1,
                    30.0,
                ),
                series(
                    "template/python/session/sync/c1/python-data",
                    "python",
                    Some("session"),
                    Some("sync"),
                    1,
                    60.0,
                ),
            ],
            ..Default::default()
        };
        r.attach_baselines();
        assert_eq!(r.series[2].p50_vs_baseline, Some(1.2));
        assert_eq!(r.series[2].baseline.as_deref(), Some("baseline/python/c1"));
        assert_eq!(r.series[3].p50_vs_baseline, Some(1.1));
        // No shell baseline was run: no ratio rather than a wrong one.
        assert_eq!(r.series[4].p50_vs_baseline, None);
        // A template's series against the same bare Docker floor.
        assert_eq!(r.series[5].p50_vs_baseline, Some(1.5));
    }

    #[test]
    fn a_burst_of_sessions_is_compared_with_as_many_bare_sandboxes_not_with_docker_execs() {
        let burst =
            |name: &str, p50| series(name, "python", Some("session"), Some("sync"), 50, p50);
        let mut r = Report {
            series: vec![
                series("baseline/python/c50", "python", None, None, 50, 1000.0),
                series(
                    "bare-sandboxes/python/c50",
                    "python",
                    None,
                    None,
                    50,
                    4000.0,
                ),
                burst("sessions-burst/first-result/c50", 2000.0),
                burst("sessions-burst-round2/first-result/c50", 1000.0),
            ],
            ..Default::default()
        };
        r.attach_baselines();
        assert_eq!(r.series[2].p50_vs_baseline, Some(0.5));
        assert_eq!(
            r.series[2].baseline.as_deref(),
            Some("bare-sandboxes/python/c50")
        );
        assert_eq!(r.series[3].p50_vs_baseline, Some(0.25));
    }

    #[test]
    fn a_series_with_failures_gets_no_ratio() {
        let mut failing = series(
            "exec/python/session/sync/c1",
            "python",
            Some("session"),
            Some("sync"),
            1,
            5.0,
        );
        failing.statuses.add_n("ok", 3);
        failing.statuses.add("internal");
        let mut r = Report {
            series: vec![
                series("baseline/python/c1", "python", None, None, 1, 40.0),
                failing,
            ],
            ..Default::default()
        };
        r.attach_baselines();
        assert_eq!(r.series[1].p50_vs_baseline, None);
    }

    #[test]
    fn the_report_round_trips_through_json() {
        let mut r = Report {
            series: vec![series("assess/c64", "python", None, None, 64, 1.0)],
            ..Default::default()
        };
        r.evaluate_targets();
        let json = serde_json::to_string(&r).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }
}
