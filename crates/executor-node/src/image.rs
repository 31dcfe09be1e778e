//! The sandbox image with the supervisor inside ([`containers::image::SANDBOX`], built by
//! `deploy/images/build.sh`), the same for every backend (the bwrap backend runs its
//! exported rootfs). `sandmesh up` and the tests call [`ensure`] / [`build_image`] before
//! starting an executor; every backend checks it with [`check_image`] at start.

use std::path::{Path, PathBuf};

use containers::image::SANDBOX;
pub use containers::image::{images_dir, ImageError};

/// Builds (or finds up to date) the sandbox image with `supervisor` installed; returns the
/// image reference (`sandmesh/sandbox:<hash>`).
pub fn build_image(supervisor: &Path) -> Result<String, ImageError> {
    SANDBOX.build(supervisor)
}

/// Where the supervisor binary is (`SANDMESH_SUPERVISOR_BIN`, next to the running program,
/// or this checkout's `target/{release,debug}`).
pub fn find_supervisor() -> Option<PathBuf> {
    SANDBOX.find_binary()
}

/// The supervisor of this source checkout, up to date
/// ([`containers::image::LocalImage::build_binary`]). Blocking.
pub fn build_supervisor() -> Result<PathBuf, ImageError> {
    SANDBOX.build_binary()
}

/// Finds or builds the supervisor and builds the image. Blocking.
pub fn ensure_image() -> Result<String, ImageError> {
    SANDBOX.ensure_blocking()
}

/// [`ensure_image`] for async callers (`sandmesh up`): the image reference to put in
/// `SANDMESH_EXEC_IMAGE`.
pub async fn ensure() -> Result<String, ImageError> {
    SANDBOX.ensure().await
}

/// The image label `deploy/images/build.sh` sets when the supervisor is installed.
pub const SUPERVISOR_LABEL: &str = "org.sandmesh.supervisor";

const BUILD_HINT: &str = "build it with deploy/images/build.sh (SUPERVISOR_BIN=<sandmesh-supervisor>) or executor_node::image::ensure_image()";

#[derive(Debug, thiserror::Error)]
pub enum ImageCheckError {
    #[error("sandbox image {image} not found; {BUILD_HINT}")]
    Missing {
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("sandbox image {image} has no sandmesh-supervisor; {BUILD_HINT}")]
    WithoutSupervisor { image: String },
}

/// Checks that the image exists and carries the supervisor.
pub async fn check_image(docker: &bollard::Docker, image: &str) -> Result<(), ImageCheckError> {
    let inspect = docker
        .inspect_image(image)
        .await
        .map_err(|source| ImageCheckError::Missing {
            image: image.to_string(),
            source,
        })?;
    let has_supervisor = inspect
        .config
        .and_then(|c| c.labels)
        .is_some_and(|l| l.contains_key(SUPERVISOR_LABEL));
    if !has_supervisor {
        return Err(ImageCheckError::WithoutSupervisor {
            image: image.to_string(),
        });
    }
    Ok(())
}
