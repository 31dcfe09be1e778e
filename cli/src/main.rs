//! `sandmesh`: the user's entry point to the mesh.
//!
//! - `up`      run every service in one process (starting a local nats-server when no
//!   `SANDMESH_NATS_URL` is set), optionally with a sample execution;
//! - `serve`   run one service on its own, for deployment;
//! - `exec`    run code through the mesh, output live;
//! - `browse`  one action in a session's browser;
//! - `confirm` list, approve, deny and watch confirmations;
//! - `ws`      workspace files;
//! - `audit`   read or follow the audit trail;
//! - `status`  live instances from `$SRV.PING` and heartbeats.

mod audit;
mod browse;
mod confirm;
mod demo;
mod exec;
mod local_nats;
mod status;
mod up;
mod ws;

use std::time::Duration;

use clap::{Parser, Subcommand};
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
    /// One action in a session's browser: navigate URL, elements, click N, screenshot, ...
    Browse(browse::BrowseArgs),
    /// List, approve, deny or watch confirmations.
    Confirm {
        #[command(subcommand)]
        command: confirm::ConfirmCommand,
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
}

/// Connects as a client with the `SANDMESH_*` settings (exit 64 on bad configuration).
async fn client_config() -> anyhow::Result<(KitConfig, async_nats::Client)> {
    let mut reader = ConfigReader::new(&ProcessEnv);
    let config = KitConfig::from_reader(&mut reader);
    kit::config::exit_on_error(reader.finish());
    let mut options = async_nats::ConnectOptions::new()
        .name("sandmesh-cli")
        .request_timeout(Some(Duration::from_secs(600)));
    if let (Some(u), Some(p)) = (&config.nats_user, &config.nats_password) {
        options = options.user_and_password(u.clone(), p.clone());
    }
    let client = options
        .connect(config.nats_url.as_str())
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
async fn mesh_client() -> anyhow::Result<MeshClient> {
    let (config, client) = client_config().await?;
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
        Command::Exec(args) => exec::run(&mesh_client().await?, args).await,
        Command::Browse(args) => browse::run(&mesh_client().await?, args).await,
        Command::Confirm { command } => confirm::run(&mesh_client().await?, command).await,
        Command::Ws { command } => ws::run(&mesh_client().await?, command).await,
        Command::Audit(args) => audit::run(&mesh_client().await?, args).await,
        Command::Status { json } => status::run(&mesh_client().await?, json).await,
    }
}
