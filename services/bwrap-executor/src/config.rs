//! Settings of the bwrap-executor. The limits an execution gets are every backend's
//! (`executor_node::NodeConfig`, `SANDMESH_EXEC_*`: image, ceilings, nofile, fsize, tmp and
//! workspace sizes, kill grace, janitor period), so all backends run a request under the same
//! rules; what only this backend has is `SANDMESH_BWRAP_*`. Every bad value of both is
//! reported together.

use std::path::PathBuf;

use executor_node::{NodeConfig, UidRange};
use kit::config::{ConfigError, ConfigReader, EnvSource};

#[derive(Debug, Clone)]
pub struct BwrapConfig {
    /// Image, ceilings and per-execution limits, shared with every backend.
    pub node: NodeConfig,
    /// Sandboxes running at once; beyond it callers get 429. A sandbox costs no warm
    /// container, so this is larger than the Docker backend's.
    pub capacity: usize,
    /// Where exported rootfs trees and the compiled seccomp filters live.
    pub state_dir: PathBuf,
    /// The `bwrap` program.
    pub bwrap: PathBuf,
    /// The cgroup file system (v1 controllers below it, or the v2 unified tree).
    pub cgroup_root: PathBuf,
    /// The uid (and gid) inside the sandbox (`SANDMESH_BWRAP_UID`, the image's user): the
    /// sandbox's user namespace maps it to the sandbox's host uid.
    pub sandbox_uid: u32,
    /// `SANDMESH_BWRAP_UIDS` (`FIRST-LAST`): the host uids sandboxes run as when the executor
    /// runs as root, one per sandbox running at once (so at least `capacity` of them), so no
    /// per-user kernel budget is shared between two. Default: 2000100000-2000199999, apart
    /// from the Docker backend's.
    pub uids: UidRange,
    /// `SANDMESH_BWRAP_UID_CLAIMS`: where a sandbox's host uid is claimed (a lock on a file per
    /// uid), a directory every bwrap node of the host must share so that no two hand out one
    /// uid. Default: `/run/sandmesh/uids`.
    pub uid_claims: PathBuf,
}

impl BwrapConfig {
    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let node = NodeConfig::from_reader(&mut r);
        let capacity = r.parse("BWRAP_CAPACITY", 16usize);
        let state_dir = PathBuf::from(r.string("BWRAP_STATE_DIR", "/var/tmp/sandmesh-bwrap"));
        let bwrap = PathBuf::from(r.string("BWRAP_BIN", "bwrap"));
        let cgroup_root = PathBuf::from(r.string("BWRAP_CGROUP_ROOT", "/sys/fs/cgroup"));
        let sandbox_uid = r.parse("BWRAP_UID", 10001u32);
        let uids = UidRange::read(&mut r, "BWRAP_UIDS", UidRange::BWRAP);
        let uid_claims = PathBuf::from(r.string("BWRAP_UID_CLAIMS", "/run/sandmesh/uids"));
        if capacity == 0 {
            r.error("SANDMESH_BWRAP_CAPACITY: at least 1");
        }
        if uids.count() < capacity as u64 {
            r.error(format!(
                "SANDMESH_BWRAP_UIDS={uids}: at least SANDMESH_BWRAP_CAPACITY ({capacity}) uids, \
                 one per sandbox running at once"
            ));
        }
        if sandbox_uid == 0 {
            r.error("SANDMESH_BWRAP_UID: sandboxes never run as root");
        }
        r.finish().map(|_| Self {
            node,
            capacity,
            state_dir,
            bwrap,
            cgroup_root,
            sandbox_uid,
            uids,
            uid_claims,
        })
    }

    /// This node's id: the instance id.
    pub fn node_id(&self) -> &str {
        self.node.node_id()
    }

    /// A config for tests and embedded use: this NATS URL, defaults for the rest.
    pub fn for_url(nats_url: &str) -> Self {
        let env = kit::config::env_map(&[("SANDMESH_NATS_URL", nats_url)]);
        Self::from_env(&env).expect("defaults are valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kit::config::env_map;

    #[test]
    fn defaults_work_on_a_laptop() {
        let c = BwrapConfig::from_env(&env_map(&[])).unwrap();
        assert_eq!(c.capacity, 16);
        assert_eq!(c.sandbox_uid, 10001);
        assert_eq!(c.uids, UidRange::BWRAP);
        assert_eq!(c.uid_claims, PathBuf::from("/run/sandmesh/uids"));
        assert_eq!(c.node.image, "sandmesh/sandbox:latest");
    }

    #[test]
    fn bad_values_of_both_backends_are_reported_together() {
        let e = BwrapConfig::from_env(&env_map(&[
            ("SANDMESH_BWRAP_CAPACITY", "0"),
            ("SANDMESH_BWRAP_UID", "0"),
            ("SANDMESH_BWRAP_UIDS", "5-1"),
            ("SANDMESH_EXEC_NOFILE", "lots"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 4, "{e}");
        assert!(e.to_string().contains("SANDMESH_BWRAP_UIDS=\"5-1\""), "{e}");
        let e = BwrapConfig::from_env(&env_map(&[("SANDMESH_BWRAP_UIDS", "5000-5003")]));
        let e = e.unwrap_err();
        assert!(
            e.0[0].contains("at least SANDMESH_BWRAP_CAPACITY (16)"),
            "{e}"
        );
    }
}
