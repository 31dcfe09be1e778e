//! The attacker's code for the kernel's per-user budgets, shared by every backend's tests: one
//! sandbox takes every inotify instance and every POSIX message-queue byte its host uid may
//! have ([`HOLD`]); another then tries to get one of each ([`TRY`]). When two sandboxes share a
//! host uid, the second fails with EMFILE until the first lets go.
//!
//! Both print one line per budget: `inotify <count> <errno>` and `mqueue <count> <errno>`
//! (the errno of the attempt that stopped it, `-` when none failed), then `fds <open fds>`, so
//! a test can tell the per-user budget (EMFILE with few descriptors open) from the process's
//! own `nofile` limit (EMFILE with all of them open).

/// Holds every inotify instance and message queue it can get, in module globals (a kernel
/// keeps them for its next cell), and reports where each stopped: the positive control, its
/// own further attempt failing.
pub const HOLD: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def _stopped():
    return errno.errorcode.get(ctypes.get_errno(), "?")
held_inotify, held_queues = [], []
while len(held_inotify) < 100000:
    fd = libc.inotify_init()
    if fd < 0:
        break
    held_inotify.append(fd)
inotify_stop = _stopped()
while len(held_queues) < 100000:
    q = libc.mq_open(("/hold-%d" % len(held_queues)).encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
    if q < 0:
        break
    held_queues.append(q)
mqueue_stop = _stopped()
print("inotify", len(held_inotify), inotify_stop)
print("mqueue", len(held_queues), mqueue_stop)
print("fds", len(os.listdir("/proc/self/fd")))
"#;

/// After [`HOLD`] in the same interpreter: one more of each, which must still fail (the budget
/// is still held).
pub const STILL_HELD: &str = r#"
again_inotify = libc.inotify_init()
print("inotify", len(held_inotify), _stopped() if again_inotify < 0 else "-")
again_queue = libc.mq_open(b"/hold-again", os.O_CREAT | os.O_RDWR, 0o600, None)
print("mqueue", len(held_queues), _stopped() if again_queue < 0 else "-")
print("fds", len(os.listdir("/proc/self/fd")))
"#;

/// Another sandbox's single try of each.
pub const TRY: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def _stopped():
    return errno.errorcode.get(ctypes.get_errno(), "?")
fd = libc.inotify_init()
print("inotify", int(fd >= 0), "-" if fd >= 0 else _stopped())
q = libc.mq_open(b"/try", os.O_CREAT | os.O_RDWR, 0o600, None)
print("mqueue", int(q >= 0), "-" if q >= 0 else _stopped())
print("fds", len(os.listdir("/proc/self/fd")))
"#;

/// What one of the programs above printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budgets {
    /// Inotify instances held, and the errno that stopped the next (`-`: none failed).
    pub inotify: (usize, String),
    /// Message queues held, and the errno that stopped the next.
    pub mqueue: (usize, String),
    /// Descriptors the process had open at the end.
    pub fds: usize,
}

impl Budgets {
    /// Parses the three lines; panics (the test fails) on anything else, with the output.
    pub fn parse(stdout: &str) -> Self {
        let field = |name: &str| -> Vec<String> {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(name).map(str::to_string))
                .unwrap_or_else(|| panic!("no {name} line in {stdout:?}"))
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let count = |v: &[String]| -> usize {
            v[0].parse()
                .unwrap_or_else(|_| panic!("not a count in {stdout:?}"))
        };
        let inotify = field("inotify ");
        let mqueue = field("mqueue ");
        let fds = field("fds ");
        Budgets {
            inotify: (count(&inotify), inotify[1].clone()),
            mqueue: (count(&mqueue), mqueue[1].clone()),
            fds: count(&fds),
        }
    }

    /// The holder's positive control: it got the whole per-user inotify budget of this host
    /// (`max_user_instances`, read on the host) and some message queues, then was refused
    /// EMFILE for each with far fewer descriptors open than `nofile` — the per-user budgets,
    /// not the process's own descriptor limit, stopped it.
    pub fn assert_exhausted(&self, max_user_instances: usize, nofile: usize) {
        assert_eq!(
            self.inotify,
            (max_user_instances, "EMFILE".to_string()),
            "every inotify instance of the uid held, then EMFILE: {self:?}"
        );
        assert!(self.mqueue.0 > 0, "some message queues held: {self:?}");
        assert_eq!(self.mqueue.1, "EMFILE", "then EMFILE: {self:?}");
        assert!(
            self.fds + 16 < nofile,
            "the descriptor limit ({nofile}) was not what stopped it: {self:?}"
        );
    }

    /// The other sandbox got one of each.
    pub fn assert_untouched(&self) {
        assert_eq!(
            (&self.inotify, &self.mqueue),
            (&(1, "-".to_string()), &(1, "-".to_string())),
            "another sandbox's inotify_init and mq_open work: {self:?}"
        );
    }
}

/// The host's per-user inotify instance budget (`fs.inotify.max_user_instances`), what a
/// sandbox's uid gets in the host's user namespace whatever its own shows.
pub fn max_user_instances() -> usize {
    std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .expect("/proc/sys/fs/inotify/max_user_instances")
        .trim()
        .parse()
        .expect("a number")
}
