//! One integration-test binary for the crate (`autotests = false`), each file of `tests/` a
//! module: a binary per file compiled and linked the dependency graph once per file.
//! `crates/test-support/tests/layout.rs` fails when a file here is left out.

mod common;
mod compose;
mod confirm;
mod e2e;
mod egress;
mod gateway;
mod mcp;
mod shutdown;
mod tenant;
mod up_early;
mod ws;
