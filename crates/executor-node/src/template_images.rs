//! `TemplateImages`: the image each template runs in on this node, built on first use
//! (`containers::template`: content-addressed, so an image built before, by this node or by
//! `sandmesh template build`, is found, not rebuilt). One build at a time per template and
//! spec: runs that need an image being built wait for that build instead of starting their
//! own. A failed build is not remembered, so the next run tries again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use messages::template::RunTemplate;
use messages::ErrorKind;
use tokio::sync::OnceCell;

/// Why a template's image could not be had. Its causes are shared: a run's answer goes to
/// every caller attached to the run.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ImageError {
    #[error("the image build task failed: {0}")]
    Task(#[source] Arc<tokio::task::JoinError>),
    /// Docker could not build (or find) it; the next run tries again.
    #[error("template {template}: its image could not be built: {source}")]
    Build {
        template: String,
        #[source]
        source: Arc<containers::image::ImageError>,
    },
}

impl ImageError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ImageError::Task(_) => ErrorKind::Internal,
            ImageError::Build { .. } => ErrorKind::Unavailable,
        }
    }
}

/// A template's name and normalized image spec: what names one image on this node.
type ImageKey = (String, Vec<u8>);

/// Cheap to clone; every clone shares the builds.
#[derive(Clone)]
pub struct TemplateImages {
    /// The node's sandbox image: the base of templates that name none.
    default_image: String,
    /// Per template name and normalized spec: its image once known.
    images: Arc<Mutex<HashMap<ImageKey, Arc<OnceCell<String>>>>>,
}

impl TemplateImages {
    pub fn new(default_image: &str) -> Self {
        Self {
            default_image: default_image.to_string(),
            images: Arc::default(),
        }
    }

    /// The image `template` runs in here (the node's own for one that adds nothing),
    /// building it when Docker has none of the same inputs.
    pub async fn image(&self, template: &RunTemplate) -> Result<String, ImageError> {
        let key = (template.name.clone(), template.image.normalized());
        let cell = {
            let mut images = self.images.lock().expect("not poisoned");
            images.entry(key).or_default().clone()
        };
        let build = || async {
            let (name, spec) = (template.name.clone(), template.image.clone());
            let base = self.default_image.clone();
            tokio::task::spawn_blocking(move || containers::template::ensure(&name, &spec, &base))
                .await
                .map_err(|e| ImageError::Task(Arc::new(e)))?
                .map_err(|e| ImageError::Build {
                    template: template.name.clone(),
                    source: Arc::new(e),
                })
        };
        cell.get_or_try_init(build).await.cloned()
    }
}
