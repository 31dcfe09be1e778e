//! `sandmesh tenant key create|list|revoke`: the HTTP gateway's API keys, kept hashed in the
//! data directory beside `tenancy.json` (see `gateway::keys` for why a file). The running
//! gateway notices every change at its next request: no restart.

use messages::tenancy::Tenant;

use crate::{creds, up};

#[derive(clap::Subcommand, Debug)]
pub enum KeyCommand {
    /// Makes a key for TENANT and prints it alone on the last line. It is shown once: only
    /// its digest is stored.
    Create {
        tenant: String,
        /// Print it as E2B's SDKs spell keys (`e2b_<hex>`, for `E2B_API_KEY`); the gateway
        /// takes either spelling.
        #[arg(long)]
        e2b: bool,
    },
    /// Lists the keys: id, tenant, when made, whether revoked.
    List,
    /// Revokes a key by its id (the gateway refuses it from its next request on).
    Revoke { id: String },
}

pub fn run(command: KeyCommand) -> anyhow::Result<i32> {
    let data_dir = creds::data_dir();
    let file = data_dir.join(gateway::keys::KEYS_FILE);
    match command {
        KeyCommand::Create { tenant, e2b } => {
            let tenant = Tenant::new(tenant)?;
            // Without a tenancy (`up --insecure`) any name goes: there are no accounts.
            let tenancy = data_dir.join(up::TENANCY_FILE);
            if tenancy.exists()
                && !sandmesh_auth::Tenancy::load(&tenancy)?
                    .tenants
                    .contains_key(&tenant)
            {
                anyhow::bail!("no tenant {tenant}: `sandmesh tenant add {tenant}` first");
            }
            let (key, record) = gateway::keys::create(&file, &tenant)?;
            eprintln!(
                "sandmesh: key {} for tenant {tenant} (stored hashed in {}); it is not shown again:",
                record.id,
                file.display()
            );
            match e2b {
                true => outln!(
                    "{}",
                    gateway::keys::e2b_spelling(&key).expect("a key just made")
                ),
                false => outln!("{key}"),
            }
        }
        KeyCommand::List => {
            for k in gateway::keys::list(&file)? {
                let state = match k.revoked_at {
                    Some(at) => format!("revoked {at}"),
                    None => "live".into(),
                };
                outln!("{}\t{}\t{}\t{state}", k.id, k.tenant, k.created_at);
            }
        }
        KeyCommand::Revoke { id } => {
            let k = gateway::keys::revoke(&file, &id)?;
            eprintln!("sandmesh: key {} of tenant {} is revoked", k.id, k.tenant);
        }
    }
    Ok(0)
}
