//! One integration-test binary for the crate (`autotests = false`), each file of `tests/` a
//! module: a binary per file compiled and linked the dependency graph once per file.
//! `crates/test-support/tests/layout.rs` fails when a file here is left out.

mod async_jobs;
mod chaos;
mod cluster;
mod common;
mod e2e;
mod exactly_once;
mod fair_share;
mod kernel;
mod metrics;
mod network;
mod parking;
mod procs;
mod quotas;
mod risk_gate;
mod sessions;
mod stop;
mod supervision;
mod sync_exec;
mod templates;
mod tenancy;
mod testrun;
mod tiering;
