//! The file trees of the images sandboxes run in, which every sandbox mounts read-only as
//! `/`: the node's sandbox image (exported at start) and each template's image (exported on
//! its first run here). Each is exported once per image id (`docker create` + `docker export`,
//! unpacked below `<state>/rootfs/<image id>`), so the cache is content-addressed — the same
//! image is never exported twice, one export at a time per id (runs that need a tree being
//! exported wait for it), and a rebuilt image gets a new tree. [`RootfsCache::refresh`]
//! (called by the janitor) notices when an image reference in use points at a new id and
//! switches new sandboxes to it; a retired tree is removed once no running sandbox holds it.
//! Trees of other image ids found on disk are left alone (another executor on the host may run
//! on them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use bollard::Docker;
use futures::TryStreamExt;
use tokio_util::io::{StreamReader, SyncIoBridge};

/// Label of the short-lived containers made only to export the image. Not `sandmesh`: the
/// docker-executor's janitor treats containers with that label as leaked sandboxes.
const EXPORT_LABEL: &str = "org.sandmesh.bwrap-export";

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("sandbox image {image} not found")]
    Inspect {
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("docker {op} for exporting {image}")]
    Docker {
        op: &'static str,
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("unpacking {image} into {path}")]
    Unpack {
        image: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One exported tree.
#[derive(Debug)]
pub struct Rootfs {
    /// The image id it was exported from (hex, without `sha256:`).
    pub id: String,
    pub path: PathBuf,
}

pub struct RootfsCache {
    docker: Docker,
    /// The node's sandbox image: its tree must exist (the node does not start without it).
    image: String,
    dir: PathBuf,
    /// The tree new sandboxes of each image reference in use mount: the node's image, and
    /// every template image run here. References of the same id share one `Arc`, so a tree
    /// retired under one name is never removed while another name still maps to it.
    current: Mutex<HashMap<String, Arc<Rootfs>>>,
    /// One export at a time per image id (the lock is held while unpacking).
    exports: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Trees replaced by a newer image, kept while a sandbox still runs on them.
    retired: Mutex<Vec<Arc<Rootfs>>>,
}

async fn image_id(docker: &Docker, image: &str) -> Result<String, RootfsError> {
    let inspect = docker
        .inspect_image(image)
        .await
        .map_err(|source| RootfsError::Inspect {
            image: image.to_string(),
            source,
        })?;
    let id = inspect.id.unwrap_or_default();
    Ok(id.trim_start_matches("sha256:").to_string())
}

/// Docker has no image of that reference (any more).
fn is_missing(e: &RootfsError) -> bool {
    matches!(
        e,
        RootfsError::Inspect {
            source: bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            },
            ..
        }
    )
}

/// Exports `image` into `dir/<id>` unless that tree exists (complete trees only: a tree is
/// unpacked under a temporary name and renamed when done).
async fn export(docker: &Docker, image: &str, id: &str, dir: &Path) -> Result<Rootfs, RootfsError> {
    let path = dir.join(id);
    if path.is_dir() {
        return Ok(Rootfs {
            id: id.to_string(),
            path,
        });
    }
    let unpack_err = |path: &Path, source| RootfsError::Unpack {
        image: image.to_string(),
        path: path.to_path_buf(),
        source,
    };
    let tmp = dir.join(format!(".{id}.{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| unpack_err(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| unpack_err(&tmp, e))?;
    let docker_err = |op, source| RootfsError::Docker {
        op,
        image: image.to_string(),
        source,
    };
    let name = format!(
        "sandmesh-bwrap-export-{}-{}",
        &id[..12.min(id.len())],
        std::process::id()
    );
    let body = bollard::models::ContainerCreateBody {
        image: Some(image.to_string()),
        labels: Some([(EXPORT_LABEL.to_string(), id.to_string())].into()),
        network_disabled: Some(true),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::default().name(&name).build();
    docker
        .create_container(Some(options), body)
        .await
        .map_err(|e| docker_err("create", e))?;
    let stream = docker
        .export_container(&name)
        .map_err(std::io::Error::other);
    let reader = SyncIoBridge::new(StreamReader::new(stream));
    let target = tmp.clone();
    let unpacked = tokio::task::spawn_blocking(move || unpack(reader, &target))
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
    let removed = docker
        .remove_container(
            &name,
            Some(RemoveContainerOptionsBuilder::default().force(true).build()),
        )
        .await;
    unpacked.map_err(|e| unpack_err(&tmp, e))?;
    removed.map_err(|e| docker_err("remove", e))?;
    // Mount points bwrap needs must exist: the root is read-only inside the sandbox.
    for d in ["workspace", "tmp", "proc", "dev"] {
        std::fs::create_dir_all(tmp.join(d)).map_err(|e| unpack_err(&tmp, e))?;
    }
    if let Err(e) = std::fs::rename(&tmp, &path) {
        // Another executor on this host exported the same image meanwhile: use its tree.
        if !path.is_dir() {
            return Err(unpack_err(&path, e));
        }
        let _ = std::fs::remove_dir_all(&tmp);
    }
    tracing::info!(image, id, path = %path.display(), "exported the sandbox rootfs");
    Ok(Rootfs {
        id: id.to_string(),
        path,
    })
}

/// Unpacks a `docker export` tar with owners and modes, skipping device nodes and fifos
/// (`--dev` gives each sandbox its own minimal `/dev`).
fn unpack(reader: impl std::io::Read, target: &Path) -> std::io::Result<()> {
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_unpack_xattrs(false);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let kind = entry.header().entry_type();
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            continue;
        }
        entry.unpack_in(target)?;
    }
    Ok(())
}

impl RootfsCache {
    /// Exports (or finds) the tree of the node's `image` below `state_dir/rootfs`.
    pub async fn open(docker: Docker, image: &str, state_dir: &Path) -> Result<Self, RootfsError> {
        let cache = Self {
            docker,
            image: image.to_string(),
            dir: state_dir.join("rootfs"),
            current: Mutex::default(),
            exports: Mutex::default(),
            retired: Mutex::default(),
        };
        cache.tree(image).await?;
        Ok(cache)
    }

    /// The tree new sandboxes of `image` mount, exported on its first use here; holding the
    /// `Arc` keeps it on disk.
    pub async fn tree(&self, image: &str) -> Result<Arc<Rootfs>, RootfsError> {
        if let Some(tree) = self
            .current
            .lock()
            .expect("rootfs lock poisoned")
            .get(image)
        {
            return Ok(tree.clone());
        }
        let id = image_id(&self.docker, image).await?;
        let tree = self.exported(image, &id).await?;
        let mut current = self.current.lock().expect("rootfs lock poisoned");
        // A run of the same image that waited on the same export may have put it there first.
        Ok(current.entry(image.to_string()).or_insert(tree).clone())
    }

    /// The tree of image id `id`: the one in use under another reference, or exported now
    /// (waiting for an export of the same id already under way).
    async fn exported(&self, image: &str, id: &str) -> Result<Arc<Rootfs>, RootfsError> {
        let export_lock = self
            .exports
            .lock()
            .expect("rootfs lock poisoned")
            .entry(id.to_string())
            .or_default()
            .clone();
        let _exporting = export_lock.lock().await;
        let in_use = self
            .current
            .lock()
            .expect("rootfs lock poisoned")
            .values()
            .find(|t| t.id == id)
            .cloned();
        match in_use {
            Some(tree) => Ok(tree),
            None => Ok(Arc::new(export(&self.docker, image, id, &self.dir).await?)),
        }
    }

    /// Switches each image reference in use to a new tree when it now names another image,
    /// and forgets a template image Docker no longer has (its next run builds and exports it
    /// again). Returns how many references it switched or forgot.
    pub async fn refresh(&self) -> Result<usize, RootfsError> {
        let in_use: Vec<(String, String)> = self
            .current
            .lock()
            .expect("rootfs lock poisoned")
            .iter()
            .map(|(image, tree)| (image.clone(), tree.id.clone()))
            .collect();
        let mut changed = 0;
        for (image, old_id) in in_use {
            let fresh = match image_id(&self.docker, &image).await {
                Ok(id) if id == old_id => continue,
                Ok(id) => Some(self.exported(&image, &id).await?),
                Err(e) if is_missing(&e) && image != self.image => None,
                Err(e) => return Err(e),
            };
            let old = {
                let mut current = self.current.lock().expect("rootfs lock poisoned");
                match fresh {
                    Some(tree) => current.insert(image, tree),
                    None => current.remove(&image),
                }
            };
            if let Some(old) = old {
                self.retire(old);
            }
            changed += 1;
        }
        self.sweep();
        Ok(changed)
    }

    fn retire(&self, tree: Arc<Rootfs>) {
        let mut retired = self.retired.lock().expect("rootfs lock poisoned");
        // Once per tree: a second `Arc` of it in the list would keep it forever.
        if !retired.iter().any(|r| Arc::ptr_eq(r, &tree)) {
            retired.push(tree);
        }
    }

    /// Removes the trees this process retired once no sandbox (and no image reference in use)
    /// holds them. Trees of other images are left alone: another executor on this host may be
    /// running on them. Returns how many trees it removed.
    pub fn sweep(&self) -> usize {
        let idle: Vec<Arc<Rootfs>> = {
            let mut retired = self.retired.lock().expect("rootfs lock poisoned");
            let (idle, busy) = retired.drain(..).partition(|r| Arc::strong_count(r) == 1);
            *retired = busy;
            idle
        };
        let mut removed = 0;
        for r in idle {
            match std::fs::remove_dir_all(&r.path) {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(path = %r.path.display(), error = %e, "cannot remove an old rootfs")
                }
            }
        }
        removed
    }
}
