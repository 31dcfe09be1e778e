//! `sandmesh`: the user's entry point to the mesh.
//!
//! - `up`      run every service in one process (starting a local nats-server when no
//!   `SANDMESH_NATS_URL` is set), optionally with a sample execution;
//! - `serve`   run one service on its own, for deployment;
//! - `exec`    run code through the mesh, output live;
//! - `browse`  one action in a session's browser;
//! - `confirm` list, approve, deny and watch confirmations;
//! - `console` where the operators' web page is and how to log in;
//! - `gateway` where the HTTP API is and how to call it;
//! - `sessions` open (with env, default timeout, TTL, template), show, list, close sessions;
//! - `ws`      workspace files;
//! - `audit`   read or follow the audit trail;
//! - `status`  live instances from `$SRV.PING` and heartbeats;
//! - `creds`   how another program connects;
//! - `tenant`  add or list tenants;
//! - `template` list, show, add, remove and build templates;
//! - `mcp`     the mesh as MCP tools for an agent (stdio, or Streamable HTTP).
//!
//! Every command prints through [`out`]: a reader that goes away ends it quietly.

// `print!` panics when the reader of a pipe goes away; `out!` and `outln!` do not.
#![deny(clippy::print_stdout)]

#[macro_use]
mod out;

mod audit;
mod browse;
mod confirm;
mod console;
mod creds;
mod demo;
mod exec;
mod face;
mod gateway;
mod keys;
mod local_nats;
mod mcp;
mod operator;
mod ports;
mod proc;
mod sessions;
mod status;
mod template;
mod tenant;
mod testrun;
mod up;
mod ws;

use std::time::Duration;

use clap::{Parser, Subcommand};
use creds::Acting;
use kit::config::{ConfigReader, ProcessEnv};
use kit::KitConfig;
use sandmesh_client::MeshClient;

#[derive(Parser, Debug)]
#[command(
    name = "sandmesh",
    version,
    about = "Safe code execution for AI agents, over NATS"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the whole mesh in one process.
    Up(up::UpArgs),
    /// Run one service on its own.
    Serve {
        /// One of: risk-assessor, confirmation, workspace-store, docker-executor, scheduler.
        service: String,
    },
    /// Run code through the mesh; output is printed live.
    Exec(exec::ExecArgs),
    /// Run a test file against a code file (pytest or node --test); one line per test.
    Test(testrun::TestArgs),
    /// One action in a session's browser: navigate URL, elements, click N, screenshot, ...
    Browse(browse::BrowseArgs),
    /// List, approve, deny or watch confirmations.
    Confirm {
        #[command(subcommand)]
        command: confirm::ConfirmCommand,
    },
    /// Print where the operators' web console is and how to log in (opens nothing).
    Console,
    /// Print where the HTTP API is and how to call it.
    Gateway,
    /// Sessions: open (with env, default timeout, TTL, template, network), get, list, close.
    Sessions {
        #[command(subcommand)]
        command: sessions::SessionsCommand,
    },
    /// A session's background processes: start, list, logs [-f], kill.
    Proc {
        #[command(subcommand)]
        command: proc::ProcCommandArgs,
    },
    /// A terminal in a session: bash in its container, this terminal in raw mode.
    Shell { session_id: String },
    /// Preview ports: expose a port a session's server listens on (a URL through the gateway).
    Ports {
        #[command(subcommand)]
        command: ports::PortsCommand,
    },
    /// Workspace files: ls, get, put, rm.
    Ws {
        #[command(subcommand)]
        command: ws::WsCommand,
    },
    /// Read or follow the audit trail.
    Audit(audit::AuditArgs),
    /// List live service instances.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Print how another program connects (URL, user, password, examples).
    Creds(tenant::CredsArgs),
    /// Add or list tenants of the local mesh.
    Tenant {
        #[command(subcommand)]
        command: tenant::TenantCommand,
    },
    /// Add, remove or list the operators who decide confirmations (live, no restart).
    Operator {
        #[command(subcommand)]
        command: operator::OperatorCommand,
    },
    /// Templates: the environments code runs in (operators and the admin write them).
    Template {
        #[command(subcommand)]
        command: template::TemplateCommand,
    },
    /// Serve the mesh as MCP tools to an agent: stdio, or Streamable HTTP with --listen.
    Mcp(mcp::McpArgs),
}

/// Connects as a client acting as `acting` with the `SANDMESH_*` settings (exit 64 on bad
/// configuration), with the credentials `sandmesh up` wrote when there are any.
async fn client_config(acting: Acting) -> anyhow::Result<(KitConfig, async_nats::Client)> {
    let mut reader = ConfigReader::new(&ProcessEnv);
    let config = KitConfig::from_reader(&mut reader);
    kit::config::exit_on_error(reader.finish());
    let mut options = async_nats::ConnectOptions::new()
        .name("sandmesh-cli")
        .request_timeout(Some(Duration::from_secs(600)));
    let (url, in_url) = sandmesh_auth::split_url(&creds::url_for(acting, &config.nats_url)?);
    // Each user's own inbox prefix: an operator may subscribe nowhere else.
    match (in_url, &config.nats_user, &config.nats_password) {
        (Some(c), _, _) => {
            options = options
                .custom_inbox_prefix(sandmesh_auth::inbox_prefix(&c.user))
                .user_and_password(c.user, c.password)
        }
        (None, Some(u), Some(p)) => {
            options = options
                .custom_inbox_prefix(sandmesh_auth::inbox_prefix(u))
                .user_and_password(u.clone(), p.clone())
        }
        _ => {}
    }
    let client = options
        .connect(sandmesh_auth::servers(&url))
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot reach NATS at {} ({e}); is the mesh up? `sandmesh up`",
                config.nats_url
            )
        })?;
    Ok((config, client))
}

/// The CLI speaks JSON, the encoding a person can read in `nats sub` while debugging.
async fn mesh_client(acting: Acting) -> anyhow::Result<MeshClient> {
    let (config, client) = client_config(acting).await?;
    Ok(MeshClient::new(client, config.subjects)
        .with_encoding(messages::Encoding::Json)
        .with_timeout(Duration::from_secs(600))
        .with_headers(kit::telemetry::inject_current))
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let code = match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandmesh: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Up(args) => up::run(args).await,
        Command::Serve { service } => up::serve_one(&service).await,
        Command::Exec(args) => exec::run(&mesh_client(Acting::Agent).await?, args).await,
        Command::Test(args) => testrun::run(&mesh_client(Acting::Agent).await?, args).await,
        Command::Browse(args) => browse::run(&mesh_client(Acting::Agent).await?, args).await,
        Command::Confirm { command } => {
            confirm::run(&mesh_client(Acting::Operator).await?, command).await
        }
        Command::Console => console::run(),
        Command::Gateway => gateway::run(),
        Command::Sessions { command } => {
            sessions::run(&mesh_client(Acting::Agent).await?, command).await
        }
        Command::Proc { command } => proc::run(&mesh_client(Acting::Agent).await?, command).await,
        Command::Shell { session_id } => {
            proc::shell(&mesh_client(Acting::Agent).await?, session_id).await
        }
        Command::Ports { command } => ports::run(&mesh_client(Acting::Agent).await?, command).await,
        Command::Ws { command } => ws::run(&mesh_client(Acting::Agent).await?, command).await,
        Command::Audit(args) => audit::run(&mesh_client(Acting::Admin).await?, args).await,
        Command::Status { json } => status::run(&mesh_client(Acting::Admin).await?, json).await,
        Command::Creds(args) => tenant::creds(args),
        Command::Tenant { command } => tenant::run(command),
        Command::Operator { command } => operator::run(command),
        // A built-in template's image builds from its definition here, with no mesh.
        Command::Template {
            command:
                template::TemplateCommand::Build {
                    name,
                    image,
                    builtin: true,
                },
        } => template::build_builtin(&name, image).await,
        Command::Template { command } => {
            template::run(&mesh_client(Acting::Admin).await?, command).await
        }
        Command::Mcp(args) => mcp::run(args).await,
    }
}
