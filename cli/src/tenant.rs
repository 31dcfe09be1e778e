//! `sandmesh creds` (how another program connects) and `sandmesh tenant add` (a new tenant
//! without a rebuild or a restart: the accounts file is rewritten and the running server
//! reloads it).

use anyhow::Context;
use messages::quota::{Quota, Quotas};
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
    /// Print only the URL with the credentials in it (for scripts: `--url "$(sandmesh creds
    /// --url-only)"`).
    #[arg(long)]
    pub url_only: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum TenantCommand {
    /// Writes a deployment's accounts and credentials into the data directory (kept if they
    /// exist): `tenancy.json` (services read their own credentials from it through
    /// `SANDMESH_TENANCY_FILE`), `nats/nats.conf` with `nats/accounts.conf`, and `creds/`.
    /// docker-compose runs this before NATS starts.
    Init {
        /// Where nats-server listens.
        #[arg(long, default_value = "127.0.0.1:4222")]
        listen: String,
        /// Where nats-server keeps JetStream data.
        #[arg(long, default_value = "/var/lib/nats/jetstream")]
        store: std::path::PathBuf,
        /// The server URL written into the credentials files (as clients reach it).
        #[arg(long, default_value = "nats://127.0.0.1:4222")]
        url: String,
    },
    /// Adds a tenant (its own account: it sees only its own sessions, workspaces and results)
    /// and prints how its agents connect. `--max-…` sets its quotas (on an existing tenant too).
    Add {
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
    },
    /// Sets a tenant's quotas, applied by a running mesh at once: each `--max-…` given replaces
    /// that limit, the others stay; `--clear` removes them all first.
    Quota {
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
        /// Remove every quota of the tenant before setting the ones given.
        #[arg(long)]
        clear: bool,
    },
    /// Lists the tenants, their agents and quotas.
    List,
    /// The HTTP gateway's API keys of tenants: create, list, revoke.
    Key {
        #[command(subcommand)]
        command: crate::keys::KeyCommand,
    },
}

/// A tenant's quotas on the command line: over one, its requests get 429 naming
/// the quota.
#[derive(clap::Args, Debug, Default)]
pub struct QuotaArgs {
    /// Executions in flight at once (else the scheduler's share of its queue).
    #[arg(long, value_name = "N")]
    pub max_executions: Option<u32>,
    /// Sessions open at once.
    #[arg(long, value_name = "N")]
    pub max_sessions: Option<u32>,
    /// Bytes in all its workspaces together (`500M`, `2G`, or bytes).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_workspace_bytes: Option<u64>,
    /// Browser sessions at once.
    #[arg(long, value_name = "N")]
    pub max_browsers: Option<u32>,
    /// AIO instances at once.
    #[arg(long, value_name = "N")]
    pub max_aio: Option<u32>,
}

impl QuotaArgs {
    /// `quotas` with each limit given here replacing its own.
    fn apply_to(&self, q: Quotas) -> Quotas {
        Quotas {
            concurrent_executions: self.max_executions.or(q.concurrent_executions),
            sessions: self.max_sessions.or(q.sessions),
            workspace_bytes: self.max_workspace_bytes.or(q.workspace_bytes),
            browsers: self.max_browsers.or(q.browsers),
            aio_instances: self.max_aio.or(q.aio_instances),
        }
    }
}

/// `1234`, `500K`, `500M`, `2G` (powers of 1024; an optional trailing `B`/`iB`).
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: a size is bytes or a number with K, M, G or T"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `sessions=3 browsers=1`, or `none`.
fn describe(q: &Quotas) -> String {
    let shown: Vec<String> = Quota::ALL
        .iter()
        .filter_map(|k| q.limit(*k).map(|n| format!("{k}={n}")))
        .collect();
    if shown.is_empty() {
        "no quotas".into()
    } else {
        shown.join(" ")
    }
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
    let file = CredsFile::load(&path)?;
    if args.url_only {
        outln!("{}", file.url_with_credentials());
    } else {
        print_creds(&file, &path);
    }
    Ok(0)
}

pub fn print_creds(c: &CredsFile, path: &std::path::Path) {
    let url = c.url_with_credentials();
    let who = match &c.tenant {
        Some(t) => format!("{} of tenant `{t}`", c.role),
        None => c.role.clone(),
    };
    outln!("# connect as {who}");
    outln!("url:      {}", c.url);
    outln!("user:     {}", c.user);
    outln!("password: {}", c.password);
    outln!("file:     {}", path.display());
    outln!();
    outln!("# the sandmesh CLI");
    outln!("SANDMESH_CREDS={} sandmesh exec 'print(1)'", path.display());
    outln!("# the nats CLI");
    outln!(
        "nats --server '{url}' req sandbox.v1.exec '{{\"language\":\"python\",\"code\":\"print(1)\"}}'"
    );
    outln!("# Python: the SDK (pip install ./clients/python) takes the same URL");
    outln!("SANDMESH_NATS_URL='{url}' python3 -c 'from sandmesh import Sandmesh; print(Sandmesh.from_env().run(\"print(1)\").stdout)'");
}

/// Saves `tenancy` and has the running server take it: the accounts file, every role's
/// credentials file, then a reload. Services that read the tenancy file (operators' scopes)
/// follow it from the save on.
pub fn apply(data_dir: &std::path::Path, tenancy: &Tenancy) -> anyhow::Result<()> {
    tenancy.save(&data_dir.join(up::TENANCY_FILE))?;
    let nats_dir = data_dir.join("nats");
    local_nats::write_accounts(&nats_dir, tenancy)?;
    // The URL the other credentials name is the running server's.
    let url = CredsFile::load(&creds::creds_dir(data_dir).join("admin.json"))
        .context("reading the admin credentials `sandmesh up` wrote")?
        .url;
    creds::write_all(data_dir, &url, tenancy)?;
    match local_nats::reload(&nats_dir) {
        Ok(()) => eprintln!("sandmesh: the running server reloaded its accounts"),
        Err(e) => eprintln!("sandmesh: saved; the server takes it at its next start ({e:#})"),
    }
    Ok(())
}

pub fn load(data_dir: &std::path::Path) -> anyhow::Result<Tenancy> {
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
    match command {
        TenantCommand::Init { listen, store, url } => {
            let tenancy = up::load_or_create_tenancy(&data_dir, &messages::Subjects::default())?;
            let nats_dir = data_dir.join("nats");
            let conf = local_nats::write_config(&nats_dir, &listen, &store, Some(&tenancy))?;
            creds::write_all(&data_dir, &url, &tenancy)?;
            eprintln!(
                "sandmesh: nats-server config {}; credentials in {}",
                conf.display(),
                creds::creds_dir(&data_dir).display()
            );
            Ok(0)
        }
        TenantCommand::Key { command } => crate::keys::run(command),
        TenantCommand::List => {
            let tenancy = load(&data_dir)?;
            for (tenant, agents) in &tenancy.tenants {
                let users: Vec<&str> = agents.iter().map(|a| a.user.as_str()).collect();
                let quotas = tenancy.quotas.get(tenant).copied().unwrap_or_default();
                outln!("{tenant}\t{}\t{}", users.join(","), describe(&quotas));
            }
            Ok(0)
        }
        TenantCommand::Quota {
            name,
            quotas,
            clear,
        } => {
            let mut tenancy = load(&data_dir)?;
            let tenant = Tenant::new(name)?;
            if !tenancy.tenants.contains_key(&tenant) {
                anyhow::bail!("no tenant {tenant}: `sandmesh tenant add {tenant}` first");
            }
            let before = match clear {
                true => Quotas::default(),
                false => tenancy.quotas.get(&tenant).copied().unwrap_or_default(),
            };
            let now = quotas.apply_to(before);
            tenancy.set_quotas(&tenant, now);
            // Quotas need no server reload: the services follow the tenancy file.
            tenancy.save(&data_dir.join(up::TENANCY_FILE))?;
            outln!("{tenant}: {}", describe(&now));
            Ok(0)
        }
        TenantCommand::Add { name, quotas } => {
            let mut tenancy = load(&data_dir)?;
            let tenant = Tenant::new(name)?;
            let existed = tenancy.tenants.contains_key(&tenant);
            tenancy.add_tenant(&tenant);
            let before = tenancy.quotas.get(&tenant).copied().unwrap_or_default();
            tenancy.set_quotas(&tenant, quotas.apply_to(before));
            apply(&data_dir, &tenancy)?;
            if existed {
                eprintln!("sandmesh: tenant {tenant} already existed; its credentials:");
            }
            let path = creds::creds_dir(&data_dir).join(format!("{tenant}-agent.json"));
            print_creds(&CredsFile::load(&path)?, &path);
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_words_and_overflow() {
        assert_eq!(parse_size("1234"), Ok(1234));
        assert_eq!(parse_size("500M"), Ok(500 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1kB"), Ok(1024));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn limits_given_replace_their_own_and_leave_the_others() {
        let before = Quotas {
            sessions: Some(3),
            browsers: Some(1),
            ..Default::default()
        };
        let args = QuotaArgs {
            max_sessions: Some(5),
            max_aio: Some(2),
            ..Default::default()
        };
        let after = args.apply_to(before);
        assert_eq!(after.sessions, Some(5));
        assert_eq!(after.browsers, Some(1));
        assert_eq!(after.aio_instances, Some(2));
        assert_eq!(describe(&after), "sessions=5 browsers=1 aio_instances=2");
    }
}
