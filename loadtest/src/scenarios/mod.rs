//! The scenarios, each writing its series into the run's [`Report`] through [`Ctx`].

pub mod assess;
pub mod burst;
pub mod exec;
pub mod http;
pub mod light;
pub mod memory;
pub mod mixed;
pub mod ports;
pub mod sessions_burst;
pub mod workspace;
pub mod workspace_bulk;

use std::path::PathBuf;
use std::time::Duration;

use bollard::Docker;

use crate::mesh::Mesh;
use crate::report::{Report, SeriesReport};

/// What every scenario needs: the mesh, Docker (when reachable), where logs go, the report.
pub struct Ctx {
    pub mesh: Mesh,
    pub docker: Option<Docker>,
    /// The `sandmesh.mesh` label of this mesh's containers.
    pub mesh_id: Option<String>,
    /// The executor's warm pool size (containers that are not leaks).
    pub warm_pool: u64,
    pub sandmesh_bin: PathBuf,
    pub work_dir: PathBuf,
    /// Per-request bound.
    pub timeout: Duration,
    /// The HTTP gateway of the mesh the loadtest started.
    pub gateway: Option<std::net::SocketAddr>,
    pub report: Report,
}

impl Ctx {
    pub fn push(&mut self, series: SeriesReport) {
        self.report.series.push(series);
    }
}

/// The id the executor labels its containers with: the creation time of the shared nodes
/// bucket (services/docker-executor/src/lib.rs `mesh_id`).
pub async fn mesh_id(mesh: &Mesh) -> Option<String> {
    let kv = mesh
        .js
        .get_key_value(mesh.subjects.nodes_bucket())
        .await
        .ok()?;
    let status = kv.status().await.ok()?;
    Some(format!("{:x}", status.info.created.unix_timestamp_nanos()))
}
