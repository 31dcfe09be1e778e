//! One integration-test binary for the crate (`autotests = false`), each file of `tests/` a
//! module: a binary per file compiled and linked the dependency graph once per file.
//! `crates/test-support/tests/layout.rs` fails when a file here is left out.

mod cleanup;
mod common;
mod durability;
mod files;
mod large_files;
mod paths;
mod revision;
mod scale;
