//! The browser image, built on demand by `deploy/images/build-browser.sh` (idempotent and
//! content-addressed: a no-op when the image for the same inputs exists).

use containers::image::{run_script, ImageError};

/// Builds (or finds up to date) the browser image; returns its reference
/// (`sandmesh/browser:<hash>`). Blocking.
pub fn ensure_image() -> Result<String, ImageError> {
    run_script("build-browser.sh", &[], &[])
}

/// [`ensure_image`] for async callers (`sandmesh up`): the value for `SANDMESH_BROWSER_IMAGE`.
pub async fn ensure() -> Result<String, ImageError> {
    tokio::task::spawn_blocking(ensure_image)
        .await
        .map_err(|e| ImageError::Failed {
            command: "build-browser.sh".into(),
            message: e.to_string(),
        })?
}
