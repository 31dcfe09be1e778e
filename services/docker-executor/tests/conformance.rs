//! The backend-conformance suite (`test_support::executor_conformance`) against the docker
//! backend: the same cases, with the same expectations, as every other backend.

test_support::executor_conformance!(crate::common::Harness);
