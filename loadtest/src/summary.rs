//! The short human summary printed at the end of a run.

use std::fmt::Write as _;

use crate::report::Report;

impl Report {
    /// The short human summary printed at the end of a run.
    pub fn human(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "sandmesh loadtest — {} CPUs, kernel {}, Docker {}, NATS {}{}",
            self.machine.cpus,
            self.machine.kernel,
            self.machine.docker,
            self.nats_url,
            if self.spawned_mesh {
                " (spawned `sandmesh up`)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "{:<44} {:>4} {:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8}  statuses",
            "series",
            "c",
            "n",
            "req/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "x base",
            "ovh p50"
        );
        for s in &self.series {
            let _ = writeln!(
                out,
                "{:<44} {:>4} {:>7} {:>9.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7} {:>8}  {}",
                s.name,
                s.concurrency,
                s.completed,
                s.throughput_rps,
                s.latency.p50_ms,
                s.latency.p90_ms,
                s.latency.p99_ms,
                s.latency.max_ms,
                s.p50_vs_baseline.map_or("-".into(), |r| format!("{r:.2}")),
                s.overhead
                    .map_or("-".into(), |o| format!("{:.2}", o.p50_ms)),
                s.statuses.compact()
            );
        }
        for s in &self.series {
            for (status, example) in &s.examples {
                let short: String = example.chars().take(200).collect();
                let _ = writeln!(out, "  {} {status}: {short}", s.name);
            }
        }
        if let Some(b) = &self.burst {
            let _ = writeln!(
                out,
                "burst: {} {} jobs published in {:.2} s, all stored after {:.2} s ({:.0}/s); \
                 lost {}, duplicated {}, unexpected {}; {}",
                b.jobs,
                b.tier,
                b.publish_s,
                b.all_stored_s,
                b.results_per_s,
                b.check.lost,
                b.check.duplicated,
                b.check.unexpected,
                b.statuses.compact()
            );
        }
        for (status, example) in self.burst.iter().flat_map(|b| &b.examples) {
            let short: String = example.chars().take(200).collect();
            let _ = writeln!(out, "  burst {status}: {short}");
        }
        if let Some(m) = &self.mixed {
            for (program, counts) in &m.by_program {
                let _ = writeln!(out, "mixed {program:<14} {}", counts.compact());
            }
            let c = &m.containers_after;
            let _ = writeln!(
                out,
                "containers after mixed: {} (warm {}, session {}, other {}); leaked beyond the \
                 warm pool of {}: {}",
                c.total, c.warm, c.session, c.other, m.warm_pool, c.leaked
            );
        }
        for p in &self.memory {
            let _ = writeln!(
                out,
                "memory: pid {} `{}` peak {:.1} MB, now {:.1} MB",
                p.pid,
                p.command,
                p.peak_mb(),
                p.rss_mb()
            );
        }
        for m in &self.idle_memory {
            let _ = writeln!(
                out,
                "idle: {:<16} {:.1} MB (peak {:.1} MB)",
                m.service, m.rss_mb, m.peak_mb
            );
        }
        for t in &self.targets {
            let verdict = match t.met {
                Some(true) => "MET    ",
                Some(false) => "NOT MET",
                None => "not run",
            };
            let _ = writeln!(
                out,
                "[{verdict}] {} — {}{}",
                t.target,
                t.measured.as_deref().unwrap_or("-"),
                if t.note.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", t.note)
                }
            );
        }
        for f in &self.failures {
            let _ = writeln!(out, "scenario failed: {f}");
        }
        out
    }
}
