//! Per-execution cgroups: memory (no swap), pids and CPU limits for one sandbox, the counters
//! that tell why it died (OOM kills, pids-limit hits) and its peak memory and CPU time, and
//! the sweep that kills what is left in one and removes it.
//!
//! Both layouts are supported: cgroup v1 (one hierarchy per controller, as on this project's
//! CI machine) and the v2 unified tree. Every sandbox cgroup lives at
//! `sandmesh-bwrap/<mesh>/<node>/<execution>` below each hierarchy, so the janitor finds the
//! ones a node left behind and never judges another mesh's (parallel test runs share a host).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The directory below each hierarchy that holds every sandbox cgroup of this service.
pub const BASE: &str = "sandmesh-bwrap";

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no usable cgroup hierarchy at {0}: need the memory and pids controllers (cgroup v1) \
         or a cgroup v2 tree with them"
    )]
    NoHierarchy(PathBuf),
    #[error(
        "cannot create {path}: the bwrap executor makes one cgroup per sandbox and needs write \
         access there (run it as root, or delegate that cgroup subtree to its user)"
    )]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot set {file} of {path}")]
    Limit {
        path: PathBuf,
        file: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Where the controllers are.
#[derive(Debug, Clone)]
enum Layout {
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        /// The CPU quota; absent on hosts without the cpu controller (then CPU is unbounded
        /// but the wall-clock timeout still holds).
        cpu: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
    },
    V2 {
        root: PathBuf,
    },
}

impl Layout {
    /// Every hierarchy a sandbox has a directory in (v1: one per controller).
    fn hierarchies(&self) -> Vec<PathBuf> {
        match self {
            Layout::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => {
                let mut all = vec![memory.clone(), pids.clone()];
                for extra in [cpu, cpuacct].into_iter().flatten() {
                    if !all.contains(extra) {
                        all.push(extra.clone());
                    }
                }
                all
            }
            Layout::V2 { root } => vec![root.clone()],
        }
    }
}

/// The limits of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_mb: u64,
    pub pids: u64,
    pub cpus: f64,
}

/// What the kernel counted for one sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub oom_kills: u64,
    pub pids_max_events: u64,
    pub peak_memory_bytes: Option<u64>,
    pub cpu_ns: Option<u64>,
}

/// This node's part of the cgroup trees: `sandmesh-bwrap/<mesh>/<node>` in each hierarchy.
#[derive(Debug, Clone)]
pub struct Cgroups {
    layout: Layout,
    mesh: String,
    node: String,
}

fn mkdir(path: &Path) -> Result<(), CgroupError> {
    fs::create_dir_all(path).map_err(|source| CgroupError::Create {
        path: path.to_path_buf(),
        source,
    })
}

fn read_keyed(path: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next()? == key).then(|| parts.next()?.parse().ok())?
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl Cgroups {
    /// Finds the hierarchies below `root` and creates this node's directories.
    pub fn open(root: &Path, mesh: &str, node: &str) -> Result<Self, CgroupError> {
        let layout = if root.join("cgroup.controllers").is_file() {
            let controllers =
                fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            if !(controllers.contains("memory") && controllers.contains("pids")) {
                return Err(CgroupError::NoHierarchy(root.to_path_buf()));
            }
            Layout::V2 {
                root: root.to_path_buf(),
            }
        } else {
            let dir = |names: &[&str]| {
                names
                    .iter()
                    .map(|n| root.join(n))
                    .find(|p| p.join("cgroup.procs").is_file())
            };
            let (Some(memory), Some(pids)) = (dir(&["memory"]), dir(&["pids"])) else {
                return Err(CgroupError::NoHierarchy(root.to_path_buf()));
            };
            Layout::V1 {
                memory,
                pids,
                cpu: dir(&["cpu", "cpu,cpuacct"]),
                cpuacct: dir(&["cpuacct", "cpu,cpuacct"]),
            }
        };
        let cgroups = Self {
            layout,
            mesh: mesh.to_string(),
            node: node.to_string(),
        };
        for h in cgroups.hierarchies() {
            mkdir(&h.join(cgroups.node_rel()))?;
        }
        if let Layout::V2 { root } = &cgroups.layout {
            // Controllers reach a v2 leaf only through every ancestor's subtree_control.
            let mut dir = root.clone();
            for part in [BASE, &cgroups.mesh, &cgroups.node] {
                enable_v2_controllers(&dir)?;
                dir = dir.join(part);
            }
            enable_v2_controllers(&dir)?;
        }
        Ok(cgroups)
    }

    fn hierarchies(&self) -> Vec<PathBuf> {
        self.layout.hierarchies()
    }

    fn node_rel(&self) -> PathBuf {
        Path::new(BASE).join(&self.mesh).join(&self.node)
    }

    pub fn version(&self) -> u8 {
        match self.layout {
            Layout::V1 { .. } => 1,
            Layout::V2 { .. } => 2,
        }
    }

    /// Creates the cgroup of one sandbox with its limits.
    pub fn create(&self, name: &str, limits: Limits) -> Result<SandboxCgroup, CgroupError> {
        let rel = self.node_rel().join(name);
        let cg = SandboxCgroup {
            layout: self.layout.clone(),
            rel,
        };
        for h in self.hierarchies() {
            mkdir(&h.join(&cg.rel))?;
        }
        if let Err(e) = cg.set_limits(limits) {
            cg.remove();
            return Err(e);
        }
        Ok(cg)
    }

    /// The sandbox cgroups of `node` (this mesh) that exist now, by name.
    pub fn list(&self, node: &str) -> Vec<String> {
        let first = self.hierarchies().remove(0);
        let dir = first.join(BASE).join(&self.mesh).join(node);
        let mut names: Vec<String> = fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The nodes of this mesh that have a directory here.
    pub fn nodes(&self) -> Vec<String> {
        let first = self.hierarchies().remove(0);
        fs::read_dir(first.join(BASE).join(&self.mesh))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The cgroup `name` of `node`, for the janitor.
    pub fn existing(&self, node: &str, name: &str) -> SandboxCgroup {
        SandboxCgroup {
            layout: self.layout.clone(),
            rel: Path::new(BASE).join(&self.mesh).join(node).join(name),
        }
    }

    /// Removes `node`'s (empty) directories once its sandboxes are gone.
    pub fn remove_node(&self, node: &str) {
        for h in self.hierarchies() {
            let _ = fs::remove_dir(h.join(BASE).join(&self.mesh).join(node));
        }
    }
}

fn enable_v2_controllers(dir: &Path) -> Result<(), CgroupError> {
    let path = dir.join("cgroup.subtree_control");
    for c in ["+memory", "+pids", "+cpu"] {
        if let Err(source) = fs::write(&path, c) {
            // cpu may be absent or held by a realtime task; memory and pids are required.
            if c != "+cpu" {
                return Err(CgroupError::Limit {
                    path: dir.to_path_buf(),
                    file: "cgroup.subtree_control",
                    source,
                });
            }
        }
    }
    Ok(())
}

/// One sandbox's cgroup (a directory per hierarchy). Dropping it does nothing: removal kills
/// processes and may wait, so the owner calls [`SandboxCgroup::remove`] where blocking is fine.
#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    layout: Layout,
    rel: PathBuf,
}

impl SandboxCgroup {
    fn dirs(&self) -> Vec<PathBuf> {
        self.layout
            .hierarchies()
            .into_iter()
            .map(|h| h.join(&self.rel))
            .collect()
    }

    /// The `cgroup.procs` files a process writes its pid into to enter this cgroup (every
    /// hierarchy: a v1 process is in one cgroup per controller).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    fn write(&self, dir: &Path, file: &'static str, value: &str) -> Result<(), CgroupError> {
        fs::write(dir.join(file), value).map_err(|source| CgroupError::Limit {
            path: dir.to_path_buf(),
            file,
            source,
        })
    }

    fn set_limits(&self, limits: Limits) -> Result<(), CgroupError> {
        let bytes = (limits.memory_mb << 20).to_string();
        let period = 100_000u64;
        let quota = ((limits.cpus * period as f64).round() as u64).max(1000);
        match &self.layout {
            Layout::V1 {
                memory, pids, cpu, ..
            } => {
                let mem = memory.join(&self.rel);
                self.write(&mem, "memory.limit_in_bytes", &bytes)?;
                // Memory + swap = memory: no swap (absent when swap accounting is off).
                if mem.join("memory.memsw.limit_in_bytes").exists() {
                    self.write(&mem, "memory.memsw.limit_in_bytes", &bytes)?;
                }
                self.write(&pids.join(&self.rel), "pids.max", &limits.pids.to_string())?;
                if let Some(cpu) = cpu {
                    let cpu = cpu.join(&self.rel);
                    self.write(&cpu, "cpu.cfs_period_us", &period.to_string())?;
                    self.write(&cpu, "cpu.cfs_quota_us", &quota.to_string())?;
                }
            }
            Layout::V2 { root } => {
                let dir = root.join(&self.rel);
                self.write(&dir, "memory.max", &bytes)?;
                if dir.join("memory.swap.max").exists() {
                    self.write(&dir, "memory.swap.max", "0")?;
                }
                self.write(&dir, "pids.max", &limits.pids.to_string())?;
                if dir.join("cpu.max").exists() {
                    self.write(&dir, "cpu.max", &format!("{quota} {period}"))?;
                }
            }
        }
        Ok(())
    }

    /// What the kernel counted so far.
    pub fn counters(&self) -> Counters {
        match &self.layout {
            Layout::V1 {
                memory,
                pids,
                cpuacct,
                ..
            } => {
                let mem = memory.join(&self.rel);
                Counters {
                    oom_kills: read_keyed(&mem.join("memory.oom_control"), "oom_kill").unwrap_or(0),
                    pids_max_events: read_keyed(&pids.join(&self.rel).join("pids.events"), "max")
                        .unwrap_or(0),
                    peak_memory_bytes: read_u64(&mem.join("memory.max_usage_in_bytes")),
                    cpu_ns: cpuacct
                        .as_ref()
                        .and_then(|c| read_u64(&c.join(&self.rel).join("cpuacct.usage"))),
                }
            }
            Layout::V2 { root } => {
                let dir = root.join(&self.rel);
                Counters {
                    oom_kills: read_keyed(&dir.join("memory.events"), "oom_kill").unwrap_or(0),
                    pids_max_events: read_keyed(&dir.join("pids.events"), "max").unwrap_or(0),
                    peak_memory_bytes: read_u64(&dir.join("memory.peak")),
                    cpu_ns: read_keyed(&dir.join("cpu.stat"), "usage_usec").map(|us| us * 1000),
                }
            }
        }
    }

    /// The processes in this cgroup now.
    pub fn pids(&self) -> Vec<i32> {
        let mut all: Vec<i32> = self
            .procs_files()
            .iter()
            .filter_map(|f| fs::read_to_string(f).ok())
            .flat_map(|t| {
                t.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// SIGKILLs every process in the cgroup until none is left (bounded), then removes its
    /// directories. Blocking; returns whether the cgroup is gone.
    pub fn remove(&self) -> bool {
        for round in 0..400 {
            let pids = self.pids();
            if let Layout::V2 { root } = &self.layout {
                // One write kills the whole subtree, forks in flight included (Linux ≥ 5.14).
                let _ = fs::write(root.join(&self.rel).join("cgroup.kill"), "1");
            }
            for pid in &pids {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            let gone = self.dirs().iter().all(|d| match fs::remove_dir(d) {
                Ok(()) => true,
                Err(e) => e.kind() == io::ErrorKind::NotFound,
            });
            if gone {
                return true;
            }
            // Killed processes leave the cgroup only once their parent reaped them.
            std::thread::sleep(Duration::from_millis(if round < 50 { 2 } else { 10 }));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_counters_are_read_by_name() {
        let dir = std::env::temp_dir().join(format!("sandmesh-cg-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("memory.oom_control");
        fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        assert_eq!(read_keyed(&f, "oom_kill"), Some(3));
        assert_eq!(read_keyed(&f, "missing"), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_tree_without_controllers_is_refused_with_the_path() {
        let dir = std::env::temp_dir().join(format!("sandmesh-cg-none-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let e = Cgroups::open(&dir, "m", "n").unwrap_err();
        assert!(matches!(e, CgroupError::NoHierarchy(ref p) if p == &dir));
        fs::remove_dir_all(&dir).unwrap();
    }
}
