//! `sandmesh creds` (how another program connects) and `sandmesh tenant add` (a new tenant
//! without a rebuild or a restart: the accounts file is rewritten and the running server
//! reloads it).

use anyhow::Context;
use messages::tenancy::Tenant;
use sandmesh_auth::Tenancy;

use crate::creds::{self, CredsFile};
use crate::{local_nats, up};

#[derive(clap::Args, Debug)]
pub struct CredsArgs {
    /// Whose credentials: `agent` (the default tenant's, or --tenant's), `operator`, `admin`.
    #[arg(long = "as", default_value = "agent")]
    pub role: String,
    /// The tenant whose agent to show (default: `default`).
    #[arg(long)]
    pub tenant: Option<String>,
}

#[derive(clap::Subcommand, Debug)]
pub enum TenantCommand {
    /// Adds a tenant (its own account: it sees only its own sessions, workspaces and results)
    /// and prints how its agents connect.
    Add { name: String },
    /// Lists the tenants.
    List,
}

pub fn creds(args: CredsArgs) -> anyhow::Result<i32> {
    let dir = creds::creds_dir(&creds::data_dir());
    let name = match (args.role.as_str(), &args.tenant) {
        ("agent", None) => "agent.json".to_string(),
        ("agent", Some(t)) => format!("{}-agent.json", Tenant::new(t.clone())?),
        ("operator", _) => "operator.json".into(),
        ("admin", _) => "admin.json".into(),
        (other, _) => anyhow::bail!("--as {other}: one of agent, operator, admin"),
    };
    let path = dir.join(name);
    if !path.exists() {
        anyhow::bail!(
            "no credentials at {}: start the mesh with `sandmesh up` (it writes them), or set \
             SANDMESH_DATA_DIR to its data directory",
            path.display()
        );
    }
    print_creds(&CredsFile::load(&path)?, &path);
    Ok(0)
}

fn print_creds(c: &CredsFile, path: &std::path::Path) {
    let url = c.url_with_credentials();
    let who = match &c.tenant {
        Some(t) => format!("{} of tenant `{t}`", c.role),
        None => c.role.clone(),
    };
    println!("# connect as {who}");
    println!("url:      {}", c.url);
    println!("user:     {}", c.user);
    println!("password: {}", c.password);
    println!("file:     {}", path.display());
    println!();
    println!("# the sandmesh CLI");
    println!("SANDMESH_CREDS={} sandmesh exec 'print(1)'", path.display());
    println!("# the nats CLI");
    println!(
        "nats --server '{url}' req sandbox.v1.exec '{{\"language\":\"python\",\"code\":\"print(1)\"}}'"
    );
    println!("# Python (nats-py; clients/python/sandmesh_client.py takes the same URL)");
    println!("nc = await nats.connect('{url}')");
}

fn load(data_dir: &std::path::Path) -> anyhow::Result<Tenancy> {
    let path = data_dir.join(up::TENANCY_FILE);
    if !path.exists() {
        anyhow::bail!(
            "no tenancy at {}: start the mesh once with `sandmesh up` (without --insecure)",
            path.display()
        );
    }
    Ok(Tenancy::load(&path)?)
}

pub fn run(command: TenantCommand) -> anyhow::Result<i32> {
    let data_dir = creds::data_dir();
    let mut tenancy = load(&data_dir)?;
    match command {
        TenantCommand::List => {
            for (tenant, agents) in &tenancy.tenants {
                let users: Vec<&str> = agents.iter().map(|a| a.user.as_str()).collect();
                println!("{tenant}\t{}", users.join(","));
            }
            Ok(0)
        }
        TenantCommand::Add { name } => {
            let tenant = Tenant::new(name)?;
            let existed = tenancy.tenants.contains_key(&tenant);
            tenancy.add_tenant(&tenant);
            tenancy.save(&data_dir.join(up::TENANCY_FILE))?;
            let nats_dir = data_dir.join("nats");
            local_nats::write_accounts(&nats_dir, &tenancy)?;
            // The URL the other credentials name is the running server's.
            let url = CredsFile::load(&creds::creds_dir(&data_dir).join("admin.json"))
                .context("reading the admin credentials `sandmesh up` wrote")?
                .url;
            creds::write_all(&data_dir, &url, &tenancy)?;
            match local_nats::reload(&nats_dir) {
                Ok(()) => eprintln!("sandmesh: the running server reloaded its accounts"),
                Err(e) => {
                    eprintln!("sandmesh: saved; the server takes it at its next start ({e:#})")
                }
            }
            if existed {
                eprintln!("sandmesh: tenant {tenant} already existed; its credentials:");
            }
            let path = creds::creds_dir(&data_dir).join(format!("{tenant}-agent.json"));
            print_creds(&CredsFile::load(&path)?, &path);
            Ok(0)
        }
    }
}
