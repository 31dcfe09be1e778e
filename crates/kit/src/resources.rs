//! `HostSampler`: the CPU and memory of the host, read from `/proc`, for the resource figures
//! an executor reports in its heartbeat (resource-aware placement) and on `/metrics`.
//!
//! Why the host and not the executor's cgroup: sandboxes are not the executor's children. The
//! Docker daemon runs them on its host (and a bwrap executor's sandboxes count against the
//! same machine), so the machine is what fills up. `/proc/stat` and `/proc/meminfo` show the
//! host even inside a container (without lxcfs), which is where the executor runs in compose
//! and Kubernetes. The figures describe the executor's own host: an executor pointed at a
//! remote `DOCKER_HOST` reports the wrong machine, so run it beside its daemon.

use std::sync::Mutex;

use messages::heartbeat::Resources;

/// Cumulative CPU time since boot, in `/proc/stat` ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuTimes {
    busy: u64,
    total: u64,
}

/// Samples the host; CPU usage is measured between consecutive samples.
#[derive(Debug, Default)]
pub struct HostSampler {
    /// The previous sample's CPU times: usage is the busy share of the ticks since then.
    last: Mutex<Option<CpuTimes>>,
}

impl HostSampler {
    /// The host's resources now, or `None` where `/proc` cannot be read (not Linux, or a
    /// restricted sandbox): placement then goes by load alone, and says so.
    pub fn sample(&self) -> Option<Resources> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let (cpus, now) = parse_stat(&stat)?;
        let (memory_total_bytes, available) = parse_meminfo(&meminfo)?;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        // The first sample measures since boot; later ones since the previous sample.
        let since = last.replace(now).unwrap_or(CpuTimes { busy: 0, total: 0 });
        Some(Resources {
            cpus: f64::from(cpus),
            cpu_usage_percent: usage_percent(since, now),
            memory_total_bytes,
            memory_used_bytes: memory_total_bytes.saturating_sub(available),
        })
    }
}

fn usage_percent(before: CpuTimes, now: CpuTimes) -> f64 {
    let total = now.total.saturating_sub(before.total);
    if total == 0 {
        return 0.0;
    }
    let busy = now.busy.saturating_sub(before.busy).min(total);
    busy as f64 * 100.0 / total as f64
}

/// The number of CPUs (`cpuN` lines) and the summed times of the `cpu` line. Idle and iowait
/// are idle time; everything else (user, nice, system, irq, softirq, steal) is busy. Guest
/// time is already inside user and nice, so it is not added again.
fn parse_stat(text: &str) -> Option<(u32, CpuTimes)> {
    let mut cpus = 0;
    let mut times = None;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("cpu") => {
                let v: Vec<u64> = fields.map_while(|f| f.parse().ok()).take(8).collect();
                if v.len() < 4 {
                    return None;
                }
                let total: u64 = v.iter().sum();
                let idle = v[3] + v.get(4).copied().unwrap_or(0);
                times = Some(CpuTimes {
                    busy: total - idle,
                    total,
                });
            }
            Some(name) if name.starts_with("cpu") => cpus += 1,
            _ => {}
        }
    }
    Some((cpus.max(1), times?))
}

/// `MemTotal` and `MemAvailable` in bytes.
fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
            Some(kib * 1024)
        })
    };
    Some((field("MemTotal")?, field("MemAvailable")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 0 50 800 50 0 0 0 0 0\n\
        cpu0 50 0 25 400 25 0 0 0 0 0\n\
        cpu1 50 0 25 400 25 0 0 0 0 0\n\
        intr 12345\nctxt 999\n";

    #[test]
    fn stat_gives_the_cpu_count_and_busy_ticks() {
        let (cpus, t) = parse_stat(STAT).unwrap();
        assert_eq!(cpus, 2);
        assert_eq!(
            t,
            CpuTimes {
                busy: 150,
                total: 1000
            }
        );
        assert!(parse_stat("intr 1\n").is_none(), "no cpu line");
        assert!(parse_stat("cpu 1 2\n").is_none(), "too few fields");
    }

    #[test]
    fn usage_is_the_busy_share_between_samples() {
        let a = CpuTimes {
            busy: 150,
            total: 1000,
        };
        let b = CpuTimes {
            busy: 250,
            total: 1200,
        };
        assert_eq!(usage_percent(a, b), 50.0);
        assert_eq!(usage_percent(b, b), 0.0, "no ticks passed");
        // A counter that went backwards (a restored VM) reads as idle, not as garbage.
        assert_eq!(usage_percent(b, a), 0.0);
    }

    #[test]
    fn meminfo_gives_total_and_available_bytes() {
        let text = "MemTotal:        8000 kB\nMemFree:  100 kB\nMemAvailable:    6000 kB\n";
        assert_eq!(parse_meminfo(text), Some((8000 * 1024, 6000 * 1024)));
        assert_eq!(parse_meminfo("MemTotal: 8000 kB\n"), None);
    }

    #[test]
    fn this_host_reports_plausible_figures() {
        let sampler = HostSampler::default();
        let r = sampler.sample().expect("/proc is readable on Linux");
        assert!(r.is_usable(), "{r:?}");
        assert!(r.memory_used_bytes <= r.memory_total_bytes, "{r:?}");
        let again = sampler.sample().unwrap();
        assert!(
            (0.0..=100.0).contains(&again.cpu_usage_percent),
            "{again:?}"
        );
    }
}
