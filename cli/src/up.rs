//! `sandmesh up` and `sandmesh serve`: services run in-process, each through its library's
//! `run(config, shutdown)`, sharing one shutdown token.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context;
use kit::config::ConfigError;
use kit::CancellationToken;

use crate::local_nats;

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Run a sample execution once the mesh is up, and print it.
    #[arg(long)]
    pub demo: bool,
    /// Stop after the sample execution instead of serving until Ctrl-C.
    #[arg(long, requires = "demo")]
    pub once: bool,
    /// Where the embedded nats-server keeps its data.
    #[arg(long, default_value = ".sandmesh")]
    pub data_dir: PathBuf,
    /// Port of the embedded nats-server.
    #[arg(long, default_value_t = 4222)]
    pub nats_port: u16,
}

type ServiceFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// The process environment as a map, so `up` can point every service at its own NATS.
fn process_env() -> HashMap<String, String> {
    std::env::vars().collect()
}

pub const SERVICES: &[&str] = &[
    "risk-assessor",
    "confirmation",
    "workspace-store",
    "docker-executor",
    "scheduler",
];

/// Builds the named services' configs (every error of every service reported together) and
/// their `run` futures.
fn build(
    names: &[&str],
    env: &HashMap<String, String>,
    shutdown: &CancellationToken,
) -> Result<Vec<(String, ServiceFuture)>, ConfigError> {
    let mut errors = Vec::new();
    let mut out: Vec<(String, ServiceFuture)> = Vec::new();
    for name in names {
        let token = shutdown.clone();
        let built: Result<ServiceFuture, ConfigError> = match *name {
            "risk-assessor" => risk_assessor::RiskAssessorConfig::from_env(env).map(|c| {
                Box::pin(async move { Ok(risk_assessor::run(c, token).await?) }) as ServiceFuture
            }),
            "confirmation" => confirmation::ConfirmationConfig::from_env(env).map(|c| {
                Box::pin(async move { Ok(confirmation::run(c, token).await?) }) as ServiceFuture
            }),
            "workspace-store" => workspace_store::WorkspaceConfig::from_env(env).map(|c| {
                Box::pin(async move { Ok(workspace_store::run(c, token).await?) }) as ServiceFuture
            }),
            "docker-executor" => docker_executor::ExecutorConfig::from_env(env).map(|c| {
                Box::pin(async move { Ok(docker_executor::run(c, token).await?) }) as ServiceFuture
            }),
            "scheduler" => scheduler::SchedulerConfig::from_env(env).map(|c| {
                Box::pin(async move { Ok(scheduler::run(c, token).await?) }) as ServiceFuture
            }),
            other => Err(ConfigError(vec![format!(
                "unknown service {other:?}; one of: {}",
                SERVICES.join(", ")
            )])),
        };
        match built {
            Ok(f) => out.push((name.to_string(), f)),
            Err(e) => errors.extend(e.0.into_iter().map(|m| format!("{name}: {m}"))),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigError(errors))
    }
}

/// Runs the services until the token fires or one of them fails.
async fn run_services(
    services: Vec<(String, ServiceFuture)>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut set = tokio::task::JoinSet::new();
    for (name, fut) in services {
        set.spawn(async move { (name, fut.await) });
    }
    let mut failure = None;
    while let Some(joined) = set.join_next().await {
        let (name, result) = joined.context("service task panicked")?;
        if let Err(e) = result {
            eprintln!("sandmesh: {name} stopped: {e:#}");
            failure.get_or_insert_with(|| anyhow::anyhow!("{name} failed: {e:#}"));
            // One service down means the mesh is not whole: stop the rest cleanly.
            shutdown.cancel();
        }
    }
    failure.map_or(Ok(()), Err)
}

pub async fn serve_one(service: &str) -> anyhow::Result<i32> {
    let config = kit::KitConfig::from_env(&kit::config::ProcessEnv);
    let config = kit::config::exit_on_error(config);
    let _telemetry =
        kit::telemetry::init(service, config.otlp_endpoint.as_deref(), config.log_json);
    let shutdown = kit::shutdown::on_signals();
    let services = kit::config::exit_on_error(build(&[service], &process_env(), &shutdown));
    run_services(services, shutdown).await?;
    Ok(0)
}

pub async fn run(args: UpArgs) -> anyhow::Result<i32> {
    let mut env = process_env();
    let kit_config = kit::config::exit_on_error(kit::KitConfig::from_env(&env));
    let _telemetry = kit::telemetry::init(
        "sandmesh",
        kit_config.otlp_endpoint.as_deref(),
        kit_config.log_json,
    );
    let configured = env
        .get("SANDMESH_NATS_URL")
        .is_some_and(|v| !v.trim().is_empty());
    let _nats = if configured {
        None
    } else {
        let server = local_nats::start(&args.data_dir.join("nats"), args.nats_port)?;
        eprintln!(
            "sandmesh: started nats-server at {} (data in {})",
            server.url,
            args.data_dir.display()
        );
        env.insert("SANDMESH_NATS_URL".into(), server.url.clone());
        Some(server)
    };
    let nats_url = env["SANDMESH_NATS_URL"].clone();
    eprintln!("sandmesh: preparing the sandbox image (built from Debian packages when missing)");
    let image = docker_executor::image::ensure()
        .await
        .context("building the sandbox image")?;
    env.entry("SANDMESH_EXEC_IMAGE".into()).or_insert(image);

    let shutdown = kit::shutdown::on_signals();
    let services = kit::config::exit_on_error(build(SERVICES, &env, &shutdown));
    let running = tokio::spawn(run_services(services, shutdown.clone()));

    let client = async_nats::connect(&nats_url).await?;
    wait_until_ready(&client, Duration::from_secs(120)).await?;
    eprintln!(
        "sandmesh: mesh is up — NATS {nats_url}; try `sandmesh exec 'print(1)'`; Ctrl-C stops it"
    );
    if args.demo {
        let code = crate::demo::run(&client, &kit_config.subjects).await;
        if args.once {
            shutdown.cancel();
            running.await??;
            return code;
        }
        code?;
    }
    running.await??;
    Ok(0)
}

/// Bounded poll until every service answers `$SRV.PING.<name>`.
async fn wait_until_ready(client: &async_nats::Client, limit: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    for name in SERVICES {
        loop {
            let ping = client.request(format!("$SRV.PING.{name}"), "".into());
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), ping).await {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("{name} did not come up within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
