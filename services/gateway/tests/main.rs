//! One integration-test binary for the crate (`autotests = false`), each file of `tests/` a
//! module: a binary per file compiled and linked the dependency graph once per file.
//! `crates/test-support/tests/layout.rs` fails when a file here is left out.

mod api;
mod common;
mod e2b;
mod large_upload;
mod ports;
mod procs;
mod unknown_fields;
mod uploads;
