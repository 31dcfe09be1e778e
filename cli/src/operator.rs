//! `sandmesh operator add | remove | list`: the people who decide confirmations, each with the
//! tenants in their scope. Live: the server reloads its accounts, and the confirmation service
//! and the console follow the tenancy file, so a new operator logs in and decides at once and a
//! removed one can no longer connect.

use anyhow::bail;
use messages::tenancy::Tenant;
use sandmesh_auth::Scope;

use crate::creds::{self, CredsFile};
use crate::tenant;

#[derive(clap::Subcommand, Debug)]
pub enum OperatorCommand {
    /// Adds an operator (or changes its scope) and prints how it connects.
    Add {
        /// 1–32 of a-z, 0-9 and `-`.
        name: String,
        /// The tenants it sees and decides for (comma-separated); every tenant when absent.
        #[arg(long, value_delimiter = ',')]
        tenants: Option<Vec<String>>,
    },
    /// Removes an operator: its credentials stop working at once.
    Remove { name: String },
    /// Lists the operators and their scopes.
    List,
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!("operator name {name:?}: use 1–32 of a-z, 0-9 and -, not starting with -");
    }
    Ok(())
}

fn scope_text(scope: &Scope) -> String {
    match scope {
        Scope::All => "*".into(),
        Scope::Tenants(set) => set.iter().map(Tenant::as_str).collect::<Vec<_>>().join(","),
    }
}

pub fn run(command: OperatorCommand) -> anyhow::Result<i32> {
    let data_dir = creds::data_dir();
    let mut tenancy = tenant::load(&data_dir)?;
    match command {
        OperatorCommand::Add { name, tenants } => {
            check_name(&name)?;
            let scope = match tenants {
                None => Scope::All,
                Some(names) => {
                    let mut set = Vec::new();
                    for t in names {
                        let t = Tenant::new(t)?;
                        if !tenancy.tenants.contains_key(&t) {
                            bail!("no tenant {t}: add it first (`sandmesh tenant add {t}`)");
                        }
                        set.push(t);
                    }
                    Scope::Tenants(set)
                }
            };
            tenancy.add_operator(&name, scope);
            tenant::apply(&data_dir, &tenancy)?;
            let path = if name == "operator" {
                creds::creds_dir(&data_dir).join("operator.json")
            } else {
                creds::operator_file(&data_dir, &name)
            };
            tenant::print_creds(&CredsFile::load(&path)?, &path);
            Ok(0)
        }
        OperatorCommand::Remove { name } => {
            if !tenancy.remove_operator(&name) {
                bail!("no operator {name}");
            }
            tenant::apply(&data_dir, &tenancy)?;
            let _ = std::fs::remove_file(creds::operator_file(&data_dir, &name));
            eprintln!("sandmesh: operator {name} removed");
            Ok(0)
        }
        OperatorCommand::List => {
            for (user, op) in &tenancy.operators {
                outln!("{user}\t{}", scope_text(&op.scope));
            }
            Ok(0)
        }
    }
}
