//! The targets every path of today's mesh must reach, judged against what one run measured.
//! `loadtest/README.md` ("Targets") says what each one stands for and why its number.

use crate::report::{Report, SeriesReport, TargetCheck};

/// The mesh's own share of an execution (end to end less the executor's `timing.exec_ms`),
/// milliseconds at p50, on each path: the hops between services, nothing of the sandbox.
const OVERHEAD_P50_MS: f64 = 2.5;
/// The first execution of a new session, end to end, milliseconds at p50.
const FIRST_SESSION_P50_MS: f64 = 100.0;
/// Risk assessments through NATS per second with two assessor instances.
const ASSESS_RPS: f64 = 20_000.0;
/// Async jobs in one burst, every one stored once.
const BURST_JOBS: u64 = 10_000;
/// Resident memory of each service alone, idle, in MB.
const IDLE_RSS_MB: f64 = 30.0;
/// What the HTTP gateway adds to the mesh overhead of the same request sent over NATS,
/// milliseconds at p50.
const GATEWAY_EXTRA_P50_MS: f64 = 1.0;
/// A kernel cell's end-to-end time, milliseconds at p50.
const KERNEL_P50_MS: f64 = 8.0;
/// A burst of new sessions to their first results, p50 as a share of the floor's: as many
/// bare hardened sandboxes started at once, each running the same program.
const SESSIONS_BURST_VS_BARE: f64 = 1.0;
/// The light backend's c=4 throughput as a share of a bare `bwrap` loop's.
const LIGHT_VS_BARE_BWRAP: f64 = 0.85;

/// `N of M not ok (status: first message)` when a series had failures, else empty.
pub fn failures(s: &SeriesReport) -> String {
    let total: u64 = s.statuses.0.values().sum();
    let bad: Vec<(&String, &u64)> = s.statuses.0.iter().filter(|(k, _)| *k != "ok").collect();
    if bad.is_empty() {
        return String::new();
    }
    let n: u64 = bad.iter().map(|(_, v)| **v).sum();
    let (status, _) = bad[0];
    let example = s.examples.get(status).map_or(String::new(), |e| {
        let short: String = e.chars().take(160).collect();
        format!(": {short}")
    });
    format!("{n} of {total} not ok ({status}{example})")
}

/// What the burst target's verdict does not say: a short run, and results that are stored
/// (nothing lost) but are not `ok`.
fn burst_note(b: &crate::report::BurstReport) -> String {
    let mut notes = Vec::new();
    if b.jobs < BURST_JOBS {
        notes.push(format!(
            "run with {} jobs, fewer than the target's {BURST_JOBS}",
            b.jobs
        ));
    }
    let bad: u64 = b
        .statuses
        .0
        .iter()
        .filter(|(k, _)| *k != "ok")
        .map(|(_, v)| v)
        .sum();
    if bad > 0 {
        notes.push(format!(
            "{bad} of the stored results are not ok: {}",
            b.statuses.compact()
        ));
    }
    notes.join("; ")
}

/// A verdict that also fails when the series it rests on had failures.
fn verdict(s: Option<&SeriesReport>, met: Option<bool>) -> (Option<bool>, String) {
    match s {
        Some(s) if !failures(s).is_empty() => (Some(false), failures(s)),
        _ => (met, String::new()),
    }
}

impl Report {
    fn find(
        &self,
        scenario: &str,
        lang: &str,
        tier: &str,
        mode: &str,
        c: usize,
    ) -> Option<&SeriesReport> {
        self.series.iter().find(|s| {
            s.scenario == scenario
                && s.language.as_deref() == Some(lang)
                && s.tier.as_deref() == Some(tier)
                && s.mode.as_deref() == Some(mode)
                && s.concurrency == c
        })
    }

    /// The mesh's overhead on one path: `series` judged, `others` (other series of the same
    /// path) reported beside it.
    fn overhead_check(
        path: &str,
        series: Option<&SeriesReport>,
        others: &[(&str, Option<&SeriesReport>)],
    ) -> TargetCheck {
        let overhead = series.and_then(|s| s.overhead);
        TargetCheck {
            target: format!(
                "{path}: mesh overhead (e2e - executor exec_ms) p50 <= {OVERHEAD_P50_MS} ms"
            ),
            measured: overhead.map(|o| {
                let mut text = format!("{:.2} ms", o.p50_ms);
                for (what, s) in others {
                    if let Some(o) = s.and_then(|s| s.overhead) {
                        text.push_str(&format!("; {what} {:.2} ms", o.p50_ms));
                    }
                }
                text
            }),
            met: verdict(series, overhead.map(|o| o.p50_ms <= OVERHEAD_P50_MS)).0,
            note: verdict(series, None).1,
        }
    }

    /// Judges today's targets against what this run measured.
    pub fn evaluate_targets(&mut self) {
        let mut t = Vec::new();
        // The hops of the mesh on each path, measured at c=1. For the ephemeral tier the
        // closed loop is judged (the bwrap backend has nothing to replace between runs); the
        // Docker ephemeral path with a warm container ready is reported beside it.
        t.push(Self::overhead_check(
            "session",
            self.find("exec", "python", "session", "sync", 1),
            &[],
        ));
        let ready = self.series.iter().find(|s| s.scenario == "ephemeral-ready");
        t.push(Self::overhead_check(
            "ephemeral",
            self.find("exec", "python", "ephemeral", "sync", 1),
            &[("with a warm Docker container ready", ready)],
        ));
        let first = self.series.iter().find(|s| s.scenario == "session-first");
        t.push(TargetCheck {
            target: format!("first execution of a new session p50 <= {FIRST_SESSION_P50_MS} ms"),
            measured: first.map(|s| format!("{:.1} ms (n={})", s.latency.p50_ms, s.latency.count)),
            met: verdict(
                first,
                first.map(|s| s.latency.count > 0 && s.latency.p50_ms <= FIRST_SESSION_P50_MS),
            )
            .0,
            note: verdict(first, None).1,
        });
        let assess = self
            .series
            .iter()
            .filter(|s| s.scenario == "assess" && s.instances == Some(2))
            .max_by(|a, b| a.throughput_rps.total_cmp(&b.throughput_rps));
        t.push(TargetCheck {
            target: format!(
                "risk assessment through NATS >= {ASSESS_RPS} req/s with two instances"
            ),
            measured: assess.map(|s| {
                format!(
                    "{:.0} req/s at concurrency {}",
                    s.throughput_rps, s.concurrency
                )
            }),
            met: verdict(assess, assess.map(|s| s.throughput_rps >= ASSESS_RPS)).0,
            note: verdict(assess, None).1,
        });
        let burst = self.burst.as_ref();
        t.push(TargetCheck {
            target: format!("burst of {BURST_JOBS} async jobs: zero lost, zero duplicated"),
            measured: burst.map(|b| {
                format!(
                    "{} jobs: {} lost, {} duplicated, {} unexpected, all stored in {:.1} s",
                    b.jobs, b.check.lost, b.check.duplicated, b.check.unexpected, b.all_stored_s
                )
            }),
            met: burst.map(|b| b.check.passed() && !b.timed_out && b.jobs >= BURST_JOBS),
            note: burst.map(burst_note).unwrap_or_default(),
        });
        let worst = self
            .idle_memory
            .iter()
            .max_by(|a, b| a.rss_mb.total_cmp(&b.rss_mb));
        t.push(TargetCheck {
            target: format!("each service idle under {IDLE_RSS_MB} MB RSS"),
            measured: worst.map(|_| {
                self.idle_memory
                    .iter()
                    .map(|m| format!("{} {:.1} MB", m.service, m.rss_mb))
                    .collect::<Vec<_>>()
                    .join(", ")
            }),
            met: worst.map(|w| w.rss_mb < IDLE_RSS_MB),
            note: String::new(),
        });
        // A warm interpreter answers without Python's start; what remains is the mesh.
        let kernel = self.find("exec", "python", "kernel", "sync", 1);
        let session_p50 = self
            .find("exec", "python", "session", "sync", 1)
            .map(|s| s.latency.p50_ms);
        t.push(TargetCheck {
            target: format!("kernel cell print(1) p50 <= {KERNEL_P50_MS} ms"),
            measured: kernel.map(|s| {
                let mut text = format!("{:.1} ms", s.latency.p50_ms);
                if let Some(p50) = session_p50 {
                    text.push_str(&format!("; a plain session execution {p50:.1} ms"));
                }
                if let Some(floor) = &s.baseline {
                    text.push_str(&format!("; {floor}"));
                }
                text
            }),
            met: verdict(kernel, kernel.map(|s| s.latency.p50_ms <= KERNEL_P50_MS)).0,
            note: verdict(kernel, None).1,
        });
        t.push(self.gateway_target());
        t.extend(self.sessions_burst_targets());
        self.targets = t;
    }

    /// The gateway's share: its mesh overhead less that of the same request over NATS in the
    /// same run (`http`), at c=1, where no queue hides it.
    fn gateway_target(&self) -> TargetCheck {
        let by_name = |name: &str| self.series.iter().find(|s| s.name == name);
        let gateway = by_name("http/gateway/python/c1");
        let nats = by_name("http/nats/python/c1");
        let extra = gateway
            .and_then(|g| g.overhead)
            .zip(nats.and_then(|n| n.overhead))
            .map(|(g, n)| (g.p50_ms - n.p50_ms, g.p50_ms, n.p50_ms));
        let failed = [gateway, nats]
            .into_iter()
            .flatten()
            .find(|s| !failures(s).is_empty());
        let (met, note) = match failed {
            Some(s) => (Some(false), failures(s)),
            None => (
                extra.map(|(x, _, _)| x <= GATEWAY_EXTRA_P50_MS),
                String::new(),
            ),
        };
        TargetCheck {
            target: format!(
                "HTTP gateway: mesh overhead p50 <= {GATEWAY_EXTRA_P50_MS} ms above NATS's (c=1)"
            ),
            measured: extra.map(|(x, g, n)| format!("{x:+.2} ms (gateway {g:.2}, NATS {n:.2})")),
            met,
            note,
        }
    }

    /// A burst of new sessions to their first results beside as many bare sandboxes started
    /// at once, and the light backend's throughput beside its bare floor (both measured by
    /// `sessions-burst`).
    fn sessions_burst_targets(&self) -> [TargetCheck; 2] {
        let burst = self.series.iter().find(|s| s.scenario == "sessions-burst");
        let ratio = burst.and_then(|s| s.p50_vs_baseline);
        let burst_check = TargetCheck {
            target: format!(
                "a burst of new sessions to their first results p50 <= {SESSIONS_BURST_VS_BARE}x \
                 as many bare sandboxes started at once"
            ),
            measured: burst.zip(ratio).map(|(s, r)| {
                format!(
                    "{r:.2}x ({} at once: p50 {:.1} ms, p99 {:.1} ms; floor {})",
                    s.concurrency,
                    s.latency.p50_ms,
                    s.latency.p99_ms,
                    s.baseline.clone().unwrap_or_default()
                )
            }),
            met: verdict(burst, ratio.map(|r| r <= SESSIONS_BURST_VS_BARE)).0,
            note: verdict(burst, None).1,
        };
        let bare = self
            .series
            .iter()
            .find(|s| s.name == "bare-bwrap/python/c4");
        let light = self.find("exec", "python", "ephemeral", "sync", 4);
        let share = bare
            .zip(light)
            .filter(|(b, _)| b.throughput_rps > 0.0)
            .map(|(b, l)| (l.throughput_rps / b.throughput_rps, l, b));
        let light_check = TargetCheck {
            target: format!(
                "light backend c=4 throughput >= {LIGHT_VS_BARE_BWRAP}x a bare bwrap loop's"
            ),
            measured: share.map(|(x, l, b)| {
                format!(
                    "{x:.2}x ({:.1} vs {:.1} req/s)",
                    l.throughput_rps, b.throughput_rps
                )
            }),
            met: verdict(light, share.map(|(x, _, _)| x >= LIGHT_VS_BARE_BWRAP)).0,
            note: verdict(light, None).1,
        };
        [burst_check, light_check]
    }
}

#[cfg(test)]
mod tests {
    use messages::ServiceName;

    use crate::ids::IdCheck;
    use crate::report::testing::series;
    use crate::report::{BurstReport, IdleMemory};
    use crate::stats::LatencySummary;

    use super::*;

    /// The target whose text starts with `prefix`.
    fn target<'a>(r: &'a Report, prefix: &str) -> &'a TargetCheck {
        r.targets
            .iter()
            .find(|t| t.target.starts_with(prefix))
            .unwrap_or_else(|| panic!("no target starts with {prefix:?}: {:?}", r.targets))
    }

    #[test]
    fn a_series_with_failures_cannot_meet_a_target() {
        let mut s = series(
            "session-first/c1",
            "python",
            Some("session"),
            Some("sync"),
            1,
            50.0,
        );
        s.statuses.add_n("ok", 8);
        s.statuses.add_n("err:unavailable", 2);
        s.examples
            .insert("err:unavailable".into(), "no executor node".into());
        let mut r = Report {
            series: vec![s],
            ..Default::default()
        };
        r.evaluate_targets();
        let first = target(&r, "first execution of a new session");
        assert_eq!(first.met, Some(false));
        assert_eq!(
            first.note,
            "2 of 10 not ok (err:unavailable: no executor node)"
        );
    }

    #[test]
    fn targets_are_judged_and_missing_ones_reported_as_not_run() {
        let mut r = Report {
            series: vec![
                series("baseline/python/c1", "python", None, None, 1, 40.0),
                series(
                    "exec/python/ephemeral/sync/c1",
                    "python",
                    Some("ephemeral"),
                    Some("sync"),
                    1,
                    60.0,
                ),
                series(
                    "exec/python/session/sync/c1",
                    "python",
                    Some("session"),
                    Some("sync"),
                    1,
                    44.0,
                ),
            ],
            idle_memory: vec![
                IdleMemory {
                    service: ServiceName::Scheduler.to_string(),
                    rss_mb: 12.0,
                    peak_mb: 13.0,
                },
                IdleMemory {
                    service: ServiceName::DockerExecutor.to_string(),
                    rss_mb: 31.0,
                    peak_mb: 31.0,
                },
            ],
            ..Default::default()
        };
        // Each path's overhead is judged on its own series.
        let overhead = |p50_ms| {
            Some(LatencySummary {
                p50_ms,
                ..Default::default()
            })
        };
        r.series[1].overhead = overhead(3.1);
        r.series[2].overhead = overhead(2.5);
        r.attach_baselines();
        r.evaluate_targets();
        let met: Vec<Option<bool>> = r.targets.iter().map(|t| t.met).collect();
        // session overhead 2.5 ms: yes; ephemeral 3.1 ms: no; first-session, assess, burst: not
        // run; idle: one service above 30 MB; kernel, gateway, sessions burst, light: not run.
        assert_eq!(
            met,
            vec![
                Some(true),
                Some(false),
                None,
                None,
                None,
                Some(false),
                None,
                None,
                None,
                None
            ]
        );
        // No target compares a path with a bare `docker exec`, which none of them pays.
        assert!(
            r.targets.iter().all(|t| !t.target.contains("docker exec")),
            "{:?}",
            r.targets
        );
        let text = r.human();
        assert!(text.contains("NOT MET"), "{text}");
        assert!(text.contains("not run"), "{text}");
        assert!(text.contains("exec/python/ephemeral/sync/c1"), "{text}");
    }

    #[test]
    fn the_kernel_target_is_judged_on_the_python_kernel_series_beside_a_plain_session() {
        let kernel = |p50| {
            let mut r = Report {
                series: vec![
                    series(
                        "exec/python/kernel/sync/c1",
                        "python",
                        Some("kernel"),
                        Some("sync"),
                        1,
                        p50,
                    ),
                    series(
                        "exec/python/session/sync/c1",
                        "python",
                        Some("session"),
                        Some("sync"),
                        1,
                        45.0,
                    ),
                ],
                ..Default::default()
            };
            r.evaluate_targets();
            r.targets
                .into_iter()
                .find(|t| t.target.starts_with("kernel cell"))
                .unwrap()
        };
        let met = kernel(6.5);
        assert_eq!(met.met, Some(true));
        let measured = met.measured.unwrap();
        assert!(
            measured.starts_with("6.5 ms; a plain session execution 45.0 ms"),
            "{measured}"
        );
        assert_eq!(kernel(9.0).met, Some(false));
    }

    #[test]
    fn the_gateway_is_judged_on_what_it_adds_to_the_same_request_over_nats() {
        let judged = |gateway_ms, nats_ms| {
            let with_overhead = |name, via, p50_ms| {
                let mut s = series(name, "python", Some("ephemeral"), Some(via), 1, 30.0);
                s.overhead = Some(LatencySummary {
                    p50_ms,
                    ..Default::default()
                });
                s
            };
            let mut r = Report {
                series: vec![
                    with_overhead("http/nats/python/c1", "nats", nats_ms),
                    with_overhead("http/gateway/python/c1", "http", gateway_ms),
                ],
                ..Default::default()
            };
            r.evaluate_targets();
            target(&r, "HTTP gateway").clone()
        };
        let met = judged(3.0, 2.5);
        assert_eq!(met.met, Some(true));
        assert_eq!(
            met.measured.as_deref(),
            Some("+0.50 ms (gateway 3.00, NATS 2.50)")
        );
        assert_eq!(judged(3.8, 2.5).met, Some(false));
    }

    #[test]
    fn a_short_or_lossy_burst_does_not_meet_the_target() {
        let mut r = Report {
            burst: Some(BurstReport {
                jobs: 500,
                check: IdCheck::compute(&["a".to_string()], &["a".to_string()], 1),
                ..Default::default()
            }),
            ..Default::default()
        };
        r.evaluate_targets();
        let burst = target(&r, "burst of");
        assert_eq!(burst.met, Some(false));
        assert!(burst.note.contains("500"), "{burst:?}");
    }

    #[test]
    fn the_sessions_burst_and_light_targets_are_judged_beside_their_floors() {
        let judged = |burst_p50, light_rps| {
            let burst = series(
                "sessions-burst/first-result/c50",
                "python",
                Some("session"),
                Some("sync"),
                50,
                burst_p50,
            );
            let floor = series(
                "bare-sandboxes/python/c50",
                "python",
                None,
                None,
                50,
                4000.0,
            );
            let mut bare = series("bare-bwrap/python/c4", "python", None, None, 4, 30.0);
            bare.throughput_rps = 100.0;
            let mut light = series(
                "exec/python/ephemeral/sync/c4",
                "python",
                Some("ephemeral"),
                Some("sync"),
                4,
                40.0,
            );
            light.throughput_rps = light_rps;
            let mut r = Report {
                series: vec![burst, floor, bare, light],
                ..Default::default()
            };
            r.attach_baselines();
            r.evaluate_targets();
            let burst = target(&r, "a burst of new sessions").clone();
            let light = target(&r, "light backend").clone();
            (burst, light)
        };
        let (burst, light) = judged(2000.0, 90.0);
        assert_eq!((burst.met, light.met), (Some(true), Some(true)));
        assert!(
            burst
                .measured
                .as_deref()
                .is_some_and(|m| m.starts_with("0.50x") && m.contains("bare-sandboxes")),
            "{burst:?}"
        );
        assert_eq!(
            light.measured.as_deref(),
            Some("0.90x (90.0 vs 100.0 req/s)")
        );
        assert_eq!(judged(4400.0, 90.0).0.met, Some(false), "slower than bare");
        assert_eq!(judged(2000.0, 80.0).1.met, Some(false), "0.80x");
    }
}
