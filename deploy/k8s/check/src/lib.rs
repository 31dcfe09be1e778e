//! sandmesh-k8s-check: validates `deploy/k8s` without a cluster, kubectl or kustomize.
//!
//! [`render`] builds a kustomization (the base, or an overlay with its JSON 6902 patches) as
//! `kustomize build` would; [`objects`] parses every rendered manifest into its `k8s-openapi`
//! type and refuses any field the type does not have; [`invariants`] checks what the
//! deployment must be (non-root, read-only root, dropped capabilities, limits, probes,
//! pinned images, NetworkPolicies that let pods reach only NATS, NATS's StatefulSet, storage
//! and routes). `tests/manifests.rs` runs all of it on the base and the `cluster` overlay;
//! `tests/nats_cluster.rs` runs the overlay's NATS configuration as three containers.

pub mod invariants;
pub mod objects;
pub mod render;

use std::path::Path;

pub use invariants::{Expect, Rule, Violation};
pub use objects::{Object, ParseError};
pub use render::{GeneratedSecret, RenderError, Rendered};

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(transparent)]
    Parse(#[from] ParseError),
}

/// A rendered kustomization, typed.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub objects: Vec<Object>,
    pub generated_secrets: Vec<GeneratedSecret>,
}

impl Deployment {
    /// Renders the kustomization in `dir` and parses every object.
    pub fn load(dir: &Path) -> Result<Self, CheckError> {
        let rendered = render::render(dir)?;
        let objects = rendered
            .objects
            .iter()
            .map(Object::parse)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            objects,
            generated_secrets: rendered.generated_secrets,
        })
    }

    pub fn violations(&self, expect: &Expect) -> Vec<Violation> {
        invariants::check(&self.objects, &self.generated_secrets, expect)
    }
}
