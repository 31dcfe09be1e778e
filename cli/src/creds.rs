//! How the CLI (and any other program) connects to a mesh with authentication on, which is every
//! mode but an explicit `--insecure`. `sandmesh up` writes one credentials file per role into its
//! data directory (`.sandmesh/creds/<name>.json`, readable by its owner only); each command picks
//! the role it needs: `exec`, `ws` and `sessions` act as the default tenant's agent, `confirm` as
//! an operator, `audit` and `status` as the deployment's admin. `--creds FILE` or `SANDMESH_CREDS`
//! names a file instead; a `SANDMESH_NATS_URL` that carries credentials is used as it is.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sandmesh_auth::{Credentials, Role, Tenancy};
use serde::{Deserialize, Serialize};

/// A role's connection details, as `sandmesh up` writes them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CredsFile {
    /// The server URL without credentials.
    pub url: String,
    pub user: String,
    pub password: String,
    /// `agent`, `operator` or `admin`.
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl CredsFile {
    /// The URL with the credentials in it (what `nats`, nats-py and `SANDMESH_NATS_URL` take).
    pub fn url_with_credentials(&self) -> String {
        Credentials {
            user: self.user.clone(),
            password: self.password.clone(),
        }
        .url(&self.url)
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading credentials {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a sandmesh credentials file", path.display()))
    }
}

/// Which role a command acts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acting {
    Agent,
    Operator,
    Admin,
}

impl Acting {
    fn file_name(self) -> &'static str {
        match self {
            Acting::Agent => "agent.json",
            Acting::Operator => "operator.json",
            Acting::Admin => "admin.json",
        }
    }
}

/// The directory `up` keeps its data in (`SANDMESH_DATA_DIR`, default `.sandmesh`).
pub fn data_dir() -> PathBuf {
    std::env::var_os("SANDMESH_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".sandmesh"))
}

pub fn creds_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("creds")
}

/// The URL (with credentials when any are found) a command acting as `acting` connects to.
pub fn url_for(acting: Acting, configured_url: &str) -> anyhow::Result<String> {
    if let Some(file) = std::env::var_os("SANDMESH_CREDS").filter(|v| !v.is_empty()) {
        return Ok(CredsFile::load(Path::new(&file))?.url_with_credentials());
    }
    if sandmesh_auth::split_url(configured_url).1.is_some() {
        return Ok(configured_url.to_string());
    }
    let file = creds_dir(&data_dir()).join(acting.file_name());
    if file.exists() {
        return Ok(CredsFile::load(&file)?.url_with_credentials());
    }
    Ok(configured_url.to_string())
}

/// Writes the credentials files of every role `up` hands out, for a server at `url`.
pub fn write_all(data_dir: &Path, url: &str, tenancy: &Tenancy) -> anyhow::Result<()> {
    let dir = creds_dir(data_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let default = messages::tenancy::Tenant::default_tenant();
    let roles = [
        (
            Acting::Agent,
            Role::Agent(&default),
            Some(default.to_string()),
        ),
        (Acting::Operator, Role::Operator("operator"), None),
        (Acting::Admin, Role::Admin, None),
    ];
    for (acting, role, tenant) in roles {
        if let Some(c) = tenancy.credentials(role) {
            write(&dir.join(acting.file_name()), url, c, acting, tenant)?;
        }
    }
    for (tenant, agents) in &tenancy.tenants {
        if let Some(c) = agents.first() {
            let file = dir.join(format!("{tenant}-agent.json"));
            write(&file, url, c, Acting::Agent, Some(tenant.to_string()))?;
        }
    }
    for (user, op) in tenancy.operators.iter().filter(|(u, _)| *u != "operator") {
        write(
            &operator_file(data_dir, user),
            url,
            &op.credentials,
            Acting::Operator,
            None,
        )?;
    }
    Ok(())
}

/// The credentials file of operator `user` (`operator` itself has `operator.json`).
pub fn operator_file(data_dir: &Path, user: &str) -> std::path::PathBuf {
    creds_dir(data_dir).join(format!("{user}-operator.json"))
}

fn write(
    path: &Path,
    url: &str,
    c: &Credentials,
    acting: Acting,
    tenant: Option<String>,
) -> anyhow::Result<()> {
    let file = CredsFile {
        url: url.to_string(),
        user: c.user.clone(),
        password: c.password.clone(),
        role: match acting {
            Acting::Agent => "agent",
            Acting::Operator => "operator",
            Acting::Admin => "admin",
        }
        .into(),
        tenant,
    };
    let text = serde_json::to_string_pretty(&file).expect("credentials serialise");
    sandmesh_auth::write_private(path, &text)?;
    Ok(())
}
