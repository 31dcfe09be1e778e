//! The test harness: a real nats-server, the real Docker daemon, the `sandmesh/aio` image
//! built from this checkout's agent, and the aio-pool running in-process.

pub mod instance;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use aio_pool::docker::LABEL_OWNER;
use aio_pool::{AioPoolConfig, AioPoolError};
use kit::CancellationToken;
use messages::Subjects;
use sandmesh_client::{AioClient, MeshClient};
use test_support::{eventually, NatsServer};

/// The AIO image with this build's agent (build.sh is idempotent and locked, so parallel
/// test binaries share one build).
pub fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        test_support::require_docker();
        let aio = containers::image::AIO;
        let agent = aio
            .build_binary()
            .unwrap_or_else(|e| panic!("building the AIO agent: {e}"));
        aio.build(&agent)
            .unwrap_or_else(|e| panic!("building the AIO image: {e}"))
    })
}

pub fn unique(tag: &str) -> String {
    format!("t{tag}-{}", messages::new_id().to_ascii_lowercase())
}

/// Settings every test starts from: no warm instances, a small cap, fast ticks.
pub fn base_env(nats: &NatsServer, owner: &str) -> HashMap<String, String> {
    [
        ("SANDMESH_NATS_URL", nats.url()),
        ("SANDMESH_INSTANCE_ID", owner.to_string()),
        ("SANDMESH_HEARTBEAT_MS", "500".into()),
        ("SANDMESH_AIO_IMAGE", image().to_string()),
        ("SANDMESH_AIO_MIN_INSTANCES", "0".into()),
        ("SANDMESH_AIO_MAX_INSTANCES", "3".into()),
        ("SANDMESH_AIO_HEALTH_MS", "300".into()),
        ("SANDMESH_AIO_JANITOR_MS", "500".into()),
        ("SANDMESH_AIO_ACQUIRE_WAIT_MS", "3000".into()),
        ("SANDMESH_AIO_MEMORY_MB", "512".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub struct Harness {
    pub nats: NatsServer,
    pub mesh: MeshClient,
    pub aio: AioClient,
    pub docker: bollard::Docker,
    pub owner: String,
    /// The pool's control directories (one per instance).
    pub control_root: std::path::PathBuf,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), AioPoolError>>>,
}

impl Harness {
    pub async fn start(extra: &[(&str, &str)]) -> Self {
        Self::start_on(NatsServer::start(), &unique("pool"), extra).await
    }

    pub async fn start_on(nats: NatsServer, owner: &str, extra: &[(&str, &str)]) -> Self {
        let mut env = base_env(&nats, owner);
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        let config = AioPoolConfig::from_env(&env).expect("test config");
        let control_root = config.socket_dir.join(owner);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(aio_pool::run(config, shutdown.clone()));
        let client = test_support::connect(&nats.url()).await;
        let mesh =
            MeshClient::new(client, Subjects::default()).with_timeout(Duration::from_secs(30));
        let aio = mesh.aio();
        let probe = aio.clone();
        eventually(
            "the aio-pool answers stats",
            Duration::from_secs(30),
            || {
                let probe = probe.clone();
                async move { probe.stats().await.ok() }
            },
        )
        .await;
        Self {
            nats,
            mesh,
            aio,
            docker: containers::connect().await.expect("docker"),
            owner: owner.to_string(),
            control_root,
            shutdown,
            task: Some(task),
        }
    }

    /// Containers (any state) this pool process owns.
    pub async fn containers(&self) -> Vec<String> {
        owned_containers(&self.docker, &self.owner).await
    }

    /// Stops the pool and checks it left nothing behind.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.expect("pool task").expect("pool run");
        }
        assert_eq!(
            self.containers().await,
            Vec::<String>::new(),
            "containers left"
        );
        assert!(
            !self.control_root.exists(),
            "control directories left in {}",
            self.control_root.display()
        );
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn owned_containers(docker: &bollard::Docker, owner: &str) -> Vec<String> {
    containers::list(docker, &format!("{LABEL_OWNER}={owner}"))
        .await
        .expect("list containers")
        .iter()
        .filter_map(containers::summary_name)
        .collect()
}

/// A shell command that runs `code` with python3 (a heredoc; the delimiter is unique).
pub fn python(code: &str) -> String {
    format!("python3 - <<'SANDMESH_PY_EOF'\n{code}\nSANDMESH_PY_EOF")
}
