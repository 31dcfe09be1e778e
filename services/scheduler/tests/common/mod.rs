//! The scheduler's tests run on the shared mesh harness of `test-support` (feature `mesh`):
//! a real nats-server and the services around the scheduler, stand-ins or real.

pub use test_support::mesh::*;
