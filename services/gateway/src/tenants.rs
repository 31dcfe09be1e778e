//! One NATS connection per tenant, as that tenant's agent user. Every call an API key makes goes
//! over its tenant's connection, so the NATS server — not the gateway — keeps tenants apart:
//! another tenant's session or execution id is simply not found.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use messages::tenancy::Tenant;
use messages::Subjects;
use sandmesh_auth::{Credentials, Role, Tenancy};
use sandmesh_client::MeshClient;
use tokio::sync::Mutex;

/// How long connecting as a tenant may take before the request fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("the tenancy file")]
    Tenancy(#[from] sandmesh_auth::TenancyError),
    #[error("tenant {0} has no agent in the tenancy file")]
    NoAgent(Tenant),
    #[error("cannot connect to NATS as tenant {tenant}")]
    Connect {
        tenant: Tenant,
        #[source]
        source: async_nats::ConnectError,
    },
}

pub struct Tenants {
    /// Where the agents' credentials are; `None` when the deployment has no tenancy
    /// (`sandmesh up --insecure`, or a server of one account): every key then acts with the
    /// gateway's own credentials, and nothing but the server's accounts keeps tenants apart.
    tenancy_file: Option<PathBuf>,
    /// The servers, without credentials: each connection brings its own.
    nats_url: String,
    /// The credentials in the gateway's own URL, for the case without a tenancy.
    own: Option<Credentials>,
    subjects: Subjects,
    timeout: Duration,
    /// Opened on a tenant's first request and kept (async-nats reconnects by itself). The
    /// async lock keeps two first requests from connecting twice.
    live: Mutex<HashMap<Tenant, MeshClient>>,
    /// `live.len()` for the heartbeat, which cannot wait for the lock.
    connected: AtomicUsize,
}

impl Tenants {
    pub fn new(
        tenancy_file: Option<PathBuf>,
        nats_url: &str,
        subjects: Subjects,
        timeout: Duration,
    ) -> Self {
        let (nats_url, own) = sandmesh_auth::split_url(nats_url);
        Self {
            tenancy_file,
            nats_url,
            own,
            subjects,
            timeout,
            live: Mutex::default(),
            connected: AtomicUsize::new(0),
        }
    }

    /// The tenant's agent connection, opened on first use. The tenancy file is read then (and
    /// only then), so a tenant added by `sandmesh tenant add` works without a restart.
    pub async fn client(&self, tenant: &Tenant) -> Result<MeshClient, TenantError> {
        let mut live = self.live.lock().await;
        if let Some(mesh) = live.get(tenant) {
            return Ok(mesh.clone());
        }
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("sandmesh-gateway ({tenant})"))
            .connection_timeout(CONNECT_TIMEOUT);
        let credentials = match &self.tenancy_file {
            Some(file) => Some(
                Tenancy::load(file)?
                    .credentials(Role::Agent(tenant))
                    .ok_or_else(|| TenantError::NoAgent(tenant.clone()))?
                    .clone(),
            ),
            None => self.own.clone(),
        };
        if let Some(c) = credentials {
            // sandmesh's clients keep to the user's own inbox prefix (an agent may also use
            // `_INBOX`; an operator or service may not).
            options = options
                .custom_inbox_prefix(sandmesh_auth::inbox_prefix(&c.user))
                .user_and_password(c.user, c.password);
        }
        let client = options
            .connect(sandmesh_auth::servers(&self.nats_url))
            .await
            .map_err(|source| TenantError::Connect {
                tenant: tenant.clone(),
                source,
            })?;
        let mesh = MeshClient::new(client, self.subjects.clone()).with_timeout(self.timeout);
        live.insert(tenant.clone(), mesh.clone());
        self.connected.store(live.len(), Ordering::Relaxed);
        Ok(mesh)
    }

    /// Tenants with an open connection.
    pub fn connected(&self) -> usize {
        self.connected.load(Ordering::Relaxed)
    }
}
