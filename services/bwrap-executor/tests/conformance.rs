//! The backend-conformance suite (`test_support::executor_conformance`) against the bwrap
//! backend: the same cases, with the same expectations, as every other backend.

mod common;

test_support::executor_conformance!(common::Harness);
