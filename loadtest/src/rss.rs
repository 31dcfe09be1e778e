//! Memory of the mesh's processes, read from `/proc/<pid>/status`: `VmHWM` (peak resident set)
//! and `VmRSS` (now). In `sandmesh up` every service shares one process, which is reported as
//! such; standalone services (`sandmesh serve <name>`) are one process each.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMemory {
    pub pid: u32,
    /// The command line, shortened: `sandmesh up`, `sandmesh serve scheduler`.
    pub command: String,
    pub peak_rss_kb: u64,
    pub rss_kb: u64,
}

impl ProcessMemory {
    pub fn peak_mb(&self) -> f64 {
        self.peak_rss_kb as f64 / 1024.0
    }

    pub fn rss_mb(&self) -> f64 {
        self.rss_kb as f64 / 1024.0
    }
}

/// `(VmHWM, VmRSS)` in kB from the text of `/proc/<pid>/status`.
pub fn parse_status(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

/// The command line of `/proc/<pid>/cmdline` (NUL-separated), with the program's directory
/// dropped: `/x/target/release/sandmesh\0up\0` → `sandmesh up`.
pub fn short_command(cmdline: &[u8]) -> String {
    let mut parts = cmdline
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let Some(program) = parts.next() else {
        return String::new();
    };
    let base = program.rsplit('/').next().unwrap_or(&program).to_string();
    std::iter::once(base)
        .chain(parts.take(3))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Is this the command line of a mesh process (`sandmesh`, `sandmesh-<service>`)?
pub fn is_mesh_process(command: &str) -> bool {
    command
        .split_whitespace()
        .next()
        .is_some_and(|p| p == "sandmesh" || p.starts_with("sandmesh-"))
        // The sandbox's own supervisor runs inside containers, not as a service.
        && !command.starts_with("sandmesh-supervisor")
}

/// One process's memory, if it still exists and can be read.
pub fn read_pid(pid: u32) -> Option<ProcessMemory> {
    let dir = Path::new("/proc").join(pid.to_string());
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
    let (peak_rss_kb, rss_kb) = parse_status(&status)?;
    Some(ProcessMemory {
        pid,
        command: short_command(&cmdline),
        peak_rss_kb,
        rss_kb,
    })
}

/// Every running mesh process on this machine, by pid.
pub fn mesh_processes() -> Vec<ProcessMemory> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<ProcessMemory> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(read_pid)
        .filter(|p| is_mesh_process(&p.command))
        .collect();
    out.sort_by_key(|p| p.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tsandmesh\nVmPeak:\t  900000 kB\nVmHWM:\t   23456 kB\n\
                          VmRSS:\t   20000 kB\nThreads:\t5\n";

    #[test]
    fn status_fields_are_parsed_in_kb() {
        assert_eq!(parse_status(STATUS), Some((23456, 20000)));
        assert_eq!(parse_status("Name:\tkthreadd\n"), None);
    }

    #[test]
    fn command_lines_are_shortened() {
        assert_eq!(
            short_command(b"/w/target/release/sandmesh\0serve\0scheduler\0"),
            "sandmesh serve scheduler"
        );
        assert_eq!(short_command(b""), "");
    }

    #[test]
    fn only_service_processes_count() {
        assert!(is_mesh_process("sandmesh up"));
        assert!(is_mesh_process("sandmesh-risk-assessor"));
        assert!(!is_mesh_process("sandmesh-supervisor keep"));
        assert!(!is_mesh_process("loadtest exec"));
        assert!(!is_mesh_process("sandmeshy"));
        assert!(!is_mesh_process(""));
    }

    #[test]
    fn this_process_can_be_read() {
        let me = read_pid(std::process::id()).expect("own /proc entry");
        assert!(me.peak_rss_kb >= me.rss_kb && me.rss_kb > 0, "{me:?}");
    }
}
