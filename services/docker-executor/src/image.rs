//! The sandbox image with the supervisor inside ([`containers::image::SANDBOX`], built by
//! `deploy/images/build.sh`). `sandmesh up` and the tests call [`ensure`] / [`build_image`]
//! before starting an executor.

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

/// Builds the supervisor of this source checkout and returns its path. Blocking.
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
