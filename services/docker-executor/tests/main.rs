//! One integration-test binary for the crate (`autotests = false`), each file of `tests/` a
//! module: a binary per file compiled and linked the dependency graph once per file.
//! `crates/test-support/tests/layout.rs` fails when a file here is left out.

mod common;
mod conformance;
mod egress;
mod exec;
mod hardening;
mod host_network;
mod isolation;
mod janitor;
mod kernel;
mod limits;
mod outlive;
mod session;
mod uids;
mod warm_pool;
mod workspace;
