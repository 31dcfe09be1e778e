//! The seccomp filters every sandbox runs under, compiled to BPF with `seccompiler` (no
//! libseccomp) and handed to bwrap (`--add-seccomp-fd`), which installs them right before it
//! starts the supervisor: everything in the sandbox — supervisor and program — is filtered.
//!
//! At least as strict as Docker's default profile for what matters: the calls that profile
//! denies to a container without capabilities (kernel modules, kexec, mount and friends,
//! namespaces, keyrings, bpf, perf, ptrace and cross-process memory, clock and swap changes,
//! accounting, quotas, the kernel log, userfaultfd, handle-based opens, reboot...) fail with
//! EPERM. `clone` with a namespace flag fails with EPERM; `clone3`, whose flags sit in memory
//! a filter cannot read, fails with ENOSYS, so libc falls back to `clone` (Docker does the
//! same). Unlike Docker, `ptrace` is denied on every kernel: nothing here needs it.
//! Calls for another architecture kill the process (seccompiler's architecture check).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("compiling the seccomp filter")]
    Compile(#[from] seccompiler::BackendError),
    #[error("this architecture ({0}) has no seccomp filter here")]
    Arch(&'static str),
    #[error("writing the seccomp filter to {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Denied outright (EPERM), whatever the arguments.
const DENIED: &[i64] = &[
    libc::SYS_acct,
    libc::SYS_add_key,
    libc::SYS_bpf,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_settime,
    libc::SYS_delete_module,
    libc::SYS_finit_module,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fsopen,
    libc::SYS_fspick,
    libc::SYS_get_mempolicy,
    libc::SYS_init_module,
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS_kcmp,
    libc::SYS_kexec_file_load,
    libc::SYS_kexec_load,
    libc::SYS_keyctl,
    libc::SYS_lookup_dcookie,
    libc::SYS_mbind,
    libc::SYS_mount,
    libc::SYS_mount_setattr,
    libc::SYS_move_mount,
    libc::SYS_move_pages,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_open_tree,
    libc::SYS_perf_event_open,
    libc::SYS_pivot_root,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_ptrace,
    libc::SYS_quotactl,
    libc::SYS_reboot,
    libc::SYS_request_key,
    libc::SYS_set_mempolicy,
    libc::SYS_setns,
    libc::SYS_settimeofday,
    libc::SYS_swapoff,
    libc::SYS_swapon,
    libc::SYS_sysfs,
    libc::SYS_syslog,
    libc::SYS_umount2,
    libc::SYS_unshare,
    libc::SYS_uselib,
    libc::SYS_userfaultfd,
    libc::SYS_ustat,
    libc::SYS_chroot,
    libc::SYS_nfsservctl,
    libc::SYS_vhangup,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// `clone` flags that make a namespace.
const NAMESPACE_FLAGS: &[i32] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
];

/// `personality` values Docker allows (Linux, 32-bit address hints, query); others EPERM.
const PERSONALITIES: &[u64] = &[0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

fn arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::Arch(std::env::consts::ARCH))
}

/// The EPERM filter: [`DENIED`], `clone` with a namespace flag, odd personalities.
pub fn deny_filter() -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            let c = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )?;
            Ok(SeccompRule::new(vec![c])?)
        })
        .collect::<Result<Vec<_>, SeccompError>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    // One rule whose conditions all hold: the value is none of the allowed ones.
    let odd = PERSONALITIES
        .iter()
        .map(|&p| {
            Ok(SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                p,
            )?)
        })
        .collect::<Result<Vec<_>, SeccompError>>()?;
    rules.insert(libc::SYS_personality, vec![SeccompRule::new(odd)?]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )?;
    Ok(filter.try_into()?)
}

/// The ENOSYS filter: `clone3` (so libc falls back to the `clone` the deny filter checks).
pub fn nosys_filter() -> Result<BpfProgram, SeccompError> {
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )?;
    Ok(filter.try_into()?)
}

/// The byte form bwrap reads from its seccomp fds: the `sock_filter` array, native-endian.
pub fn to_bytes(program: &BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(program.len() * 8);
    for f in program {
        out.extend_from_slice(&f.code.to_ne_bytes());
        out.push(f.jt);
        out.push(f.jf);
        out.extend_from_slice(&f.k.to_ne_bytes());
    }
    out
}

/// The two compiled filters on disk (bwrap's fds are opened from them per sandbox).
#[derive(Debug, Clone)]
pub struct Filters {
    pub deny: PathBuf,
    pub nosys: PathBuf,
}

impl Filters {
    /// Compiles both filters and writes them below `dir` (replacing older ones atomically).
    pub fn write(dir: &Path) -> Result<Self, SeccompError> {
        let write = |name: &str, program: BpfProgram| {
            let path = dir.join(name);
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(&tmp, to_bytes(&program)))
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|source| SeccompError::Write {
                    path: path.clone(),
                    source,
                })?;
            Ok::<_, SeccompError>(path)
        };
        Ok(Self {
            deny: write("seccomp-deny.bpf", deny_filter()?)?,
            nosys: write("seccomp-nosys.bpf", nosys_filter()?)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile_and_serialise_as_sock_filter_arrays() {
        let deny = deny_filter().unwrap();
        let bytes = to_bytes(&deny);
        assert_eq!(bytes.len(), deny.len() * 8);
        assert!(
            deny.len() > DENIED.len(),
            "one check per denied call at least"
        );
        assert!(!nosys_filter().unwrap().is_empty());
    }
}
