//! [`ContainerGauges`]: the Docker backend's own figures, shared by the actors that change
//! them (the warm pool, the session containers) and the heartbeat that reports them.

use std::sync::atomic::AtomicUsize;

/// What the heartbeat reports besides the node's own gauges.
#[derive(Debug, Default)]
pub struct ContainerGauges {
    /// Ready containers in the node's own warm pool.
    pub warm: AtomicUsize,
    /// What the node's own warm pool is growing or shrinking to (its demand, `crate::demand`).
    pub warm_target: AtomicUsize,
    /// Live session containers.
    pub sessions: AtomicUsize,
}
