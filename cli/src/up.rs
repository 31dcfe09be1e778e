//! `sandmesh up` and `sandmesh serve`: services run in-process, each through its library's
//! `run(config, shutdown)`, sharing one shutdown token.
//!
//! Stopping always ends: after the token fires the services get `SANDMESH_SHUTDOWN_GRACE_MS`
//! plus [`STOP_MARGIN`] to finish (with NATS gone some of them never would), then this node's
//! sandbox containers are removed through Docker whatever state the executor was left in.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context;
use docker_executor::docker::{SandboxSpec, Sandboxes};
use docker_executor::ExecutorConfig;
use kit::config::ConfigError;
use kit::pending::Pending;
use kit::CancellationToken;
use messages::tenancy::Tenant;
use messages::{ServiceName, Subjects};
use sandmesh_auth::{Role, Tenancy};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{creds, local_nats};

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Run a sample execution once the mesh is up, and print it.
    #[arg(long)]
    pub demo: bool,
    /// Stop after the sample execution instead of serving until Ctrl-C.
    #[arg(long, requires = "demo")]
    pub once: bool,
    /// Where the embedded nats-server keeps its data, and the generated credentials.
    #[arg(long, env = "SANDMESH_DATA_DIR", default_value = ".sandmesh")]
    pub data_dir: PathBuf,
    /// Port of the embedded nats-server.
    #[arg(long, default_value_t = 4222)]
    pub nats_port: u16,
    /// The egress ceiling: the domains (and CIDRs, `!denied` names, `*`) sandboxes may be
    /// allowed to reach at all; nothing when unset (every network policy is refused).
    #[arg(long, env = "SANDMESH_NETWORK_ALLOW", value_name = "LIST")]
    pub network_allow: Option<String>,
    /// DEBUGGING ONLY: run NATS without accounts or passwords. Every client is then trusted
    /// like a service: agents can approve their own code and read each other's results.
    #[arg(long)]
    pub insecure: bool,
}

type ServiceFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// How long the services may take to stop beyond the grace period of their requests.
const STOP_MARGIN: Duration = Duration::from_secs(5);
/// Docker answers locally, so removing a node's containers takes seconds; a hung daemon must
/// not hold the process either.
const REMOVAL_LIMIT: Duration = Duration::from_secs(20);
/// How often a long wait says that it is still waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The process environment as a map, so `up` can point every service at its own NATS.
fn process_env() -> HashMap<String, String> {
    std::env::vars().collect()
}

/// The services `up` runs, in start order (plus the bwrap-executor when bubblewrap works
/// here, see [`up_services`]).
pub const SERVICES: &[ServiceName] = &[
    ServiceName::RiskAssessor,
    ServiceName::Confirmation,
    ServiceName::Templates,
    ServiceName::WorkspaceStore,
    ServiceName::DockerExecutor,
    ServiceName::AioPool,
    ServiceName::Scheduler,
    ServiceName::BrowserRouter,
];

/// What `up` runs: [`SERVICES`], and the light backend when `bwrap` starts (it is optional:
/// without it, ephemeral executions run in Docker as before). Says which.
fn up_services(env: &HashMap<String, String>, faces: &mut Faces) -> Vec<ServiceName> {
    let mut services = SERVICES.to_vec();
    let bwrap = env
        .get("SANDMESH_BWRAP_BIN")
        .map_or_else(|| PathBuf::from("bwrap"), PathBuf::from);
    if bwrap_executor::bwrap_available(&bwrap) {
        eprintln!(
            "sandmesh: bubblewrap found: SAFE ephemeral executions run in a fresh bubblewrap \
             sandbox each (bwrap-executor)"
        );
        services.insert(services.len() - 1, ServiceName::BwrapExecutor);
    } else {
        eprintln!(
            "sandmesh: bubblewrap not found: every execution runs in Docker (install Debian's \
             bubblewrap for the light backend)"
        );
    }
    // The operators' web page, last: it only reads what the others publish. It is optional:
    // a taken port (another mesh on this machine) must not keep the mesh from starting.
    match crate::console::FACE.listen(env) {
        Ok(listener) => {
            services.push(ServiceName::Console);
            faces.console = listener;
        }
        Err(why) => eprintln!("sandmesh: running without the operators' console: {why}"),
    }
    // The HTTP API, optional for the same reason.
    match crate::gateway::FACE.listen(env) {
        Ok(listener) => {
            services.push(ServiceName::Gateway);
            faces.gateway = listener;
        }
        Err(why) => eprintln!("sandmesh: running without the HTTP gateway: {why}"),
    }
    services
}

/// The HTTP faces' sockets `up` listens on before their services start (see
/// [`crate::face::HttpFace::listen`]); a face without one binds its configured address itself.
#[derive(Default)]
struct Faces {
    console: Option<std::net::TcpListener>,
    gateway: Option<std::net::TcpListener>,
    /// The gateway's second listener, for E2B's SDKs.
    e2b: Option<std::net::TcpListener>,
}

fn tokio_listener(listener: std::net::TcpListener) -> anyhow::Result<tokio::net::TcpListener> {
    Ok(tokio::net::TcpListener::from_std(listener)?)
}

fn service_list() -> String {
    SERVICES
        .iter()
        .chain([
            &ServiceName::BwrapExecutor,
            &ServiceName::Console,
            &ServiceName::Gateway,
        ])
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The services' `run` futures, and the executor's config when one of them is the executor
/// (its node id labels the containers to remove at the end).
struct Services {
    futures: Vec<(String, ServiceFuture)>,
    executor: Option<ExecutorConfig>,
}

/// Builds the named services' configs (every error of every service reported together) and
/// their `run` futures.
fn build(
    names: &[ServiceName],
    env: &HashMap<String, String>,
    auth: Option<&ServiceAuth>,
    builds: &ImageBuilds,
    mut faces: Faces,
    shutdown: &CancellationToken,
) -> Result<Services, ConfigError> {
    let mut errors = Vec::new();
    let mut futures: Vec<(String, ServiceFuture)> = Vec::new();
    let mut executor = None;
    for name in names {
        let token = shutdown.clone();
        let env = &service_env(env, *name, auth);
        let built: Result<ServiceFuture, ConfigError> = match *name {
            ServiceName::RiskAssessor => {
                risk_assessor::RiskAssessorConfig::from_env(env).map(|c| {
                    Box::pin(async move { Ok(risk_assessor::run(c, token).await?) })
                        as ServiceFuture
                })
            }
            ServiceName::Confirmation => confirmation::ConfirmationConfig::from_env(env).map(|c| {
                Box::pin(async move { Ok(confirmation::run(c, token).await?) }) as ServiceFuture
            }),
            ServiceName::Templates => templates::TemplatesConfig::from_env(env).map(|c| {
                Box::pin(async move { Ok(templates::run(c, token).await?) }) as ServiceFuture
            }),
            ServiceName::WorkspaceStore => {
                workspace_store::WorkspaceConfig::from_env(env).map(|c| {
                    Box::pin(async move { Ok(workspace_store::run(c, token).await?) })
                        as ServiceFuture
                })
            }
            ServiceName::DockerExecutor => ExecutorConfig::from_env(env).map(|c| {
                executor = Some(c.clone());
                Box::pin(async move { Ok(docker_executor::run(c, token).await?) }) as ServiceFuture
            }),
            ServiceName::AioPool => aio_pool::AioPoolConfig::from_env(env).map(|mut c| {
                c.image_build = builds.aio.clone();
                Box::pin(async move { Ok(aio_pool::run(c, token).await?) }) as ServiceFuture
            }),
            ServiceName::BwrapExecutor => bwrap_executor::BwrapConfig::from_env(env).map(|c| {
                Box::pin(async move { Ok(bwrap_executor::run(c, token).await?) }) as ServiceFuture
            }),
            ServiceName::Scheduler => scheduler::SchedulerConfig::from_env(env).map(|c| {
                Box::pin(async move { Ok(scheduler::run(c, token).await?) }) as ServiceFuture
            }),
            ServiceName::BrowserRouter => {
                browser_router::BrowserConfig::from_env(env).map(|mut c| {
                    c.image_build = builds.browser.clone();
                    Box::pin(async move { Ok(browser_router::run(c, token).await?) })
                        as ServiceFuture
                })
            }
            ServiceName::Console => ::console::ConsoleConfig::from_env(env).map(|c| {
                let listener = faces.console.take();
                Box::pin(async move {
                    match listener {
                        Some(l) => ::console::serve(tokio_listener(l)?, c, token).await?,
                        None => ::console::run(c, token).await?,
                    }
                    Ok(())
                }) as ServiceFuture
            }),
            ServiceName::Gateway => ::gateway::GatewayConfig::from_env(env).map(|c| {
                let (listener, e2b) = (faces.gateway.take(), faces.e2b.take());
                Box::pin(async move {
                    match listener {
                        Some(l) => {
                            let e2b = e2b.map(tokio_listener).transpose()?;
                            ::gateway::serve_with(tokio_listener(l)?, e2b, c, token).await?
                        }
                        None => ::gateway::run(c, token).await?,
                    }
                    Ok(())
                }) as ServiceFuture
            }),
        };
        match built {
            Ok(f) => futures.push((name.to_string(), f)),
            Err(e) => errors.extend(e.0.into_iter().map(|m| format!("{name}: {m}"))),
        }
    }
    if errors.is_empty() {
        Ok(Services { futures, executor })
    } else {
        Err(ConfigError(errors))
    }
}

/// Images `up` builds while the mesh serves, for the services that need them.
#[derive(Default)]
struct ImageBuilds {
    browser: Option<Pending>,
    aio: Option<Pending>,
}

/// How long `up` waits for the background builds before it starts the services: an image
/// that is up to date is found within it, and its service then starts as it always did (no
/// moment of "still building" after a plain restart).
const UP_TO_DATE_WITHIN: Duration = Duration::from_secs(5);

impl ImageBuilds {
    /// The builds that are done within [`UP_TO_DATE_WITHIN`] go into `env`, as if configured.
    async fn settle(&mut self, env: &mut HashMap<String, String>) {
        let quick = |build: &Option<Pending>| {
            let build = build.clone();
            async move {
                match build {
                    Some(b) => b.made_within(UP_TO_DATE_WITHIN).await,
                    None => None,
                }
            }
        };
        let (browser, aio) = tokio::join!(quick(&self.browser), quick(&self.aio));
        for (made, build, var) in [
            (browser, &mut self.browser, "SANDMESH_BROWSER_IMAGE"),
            (aio, &mut self.aio, "SANDMESH_AIO_IMAGE"),
        ] {
            if let Some(image) = made {
                env.insert(var.into(), image);
                *build = None;
            }
        }
    }
}

/// How often a background build says it is still going: rarely, the mesh's own log goes on.
const BACKGROUND_PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// Starts building `what` on a task of its own: one line when it starts, one every
/// [`BACKGROUND_PROGRESS_EVERY`], one when it is done (or failed).
fn build_in_background<F>(what: &'static str, build: F) -> Pending
where
    F: Future<Output = Result<String, containers::image::ImageError>> + Send + 'static,
{
    eprintln!("sandmesh: building {what} in the background (when missing; Debian's chromium takes minutes the first time)");
    Pending::spawn(what, async move {
        let started = Instant::now();
        let built = with_progress_every(
            &format!("building {what}"),
            BACKGROUND_PROGRESS_EVERY,
            build,
        )
        .await;
        match &built {
            Ok(image) => eprintln!(
                "sandmesh: {what} is ready ({image}, {} s)",
                started.elapsed().as_secs()
            ),
            Err(e) => eprintln!("sandmesh: building {what} failed: {}", kit::error_chain(e)),
        }
        built.map_err(|e| kit::error_chain(&e))
    })
}

/// What the services need to connect as themselves: the server URL and the tenancy.
struct ServiceAuth {
    url: String,
    tenancy: Tenancy,
}

/// `env` with the service's own credentials in `SANDMESH_NATS_URL` (each service is allowed
/// only its own subjects and JetStream assets), and the operators' scopes for the
/// confirmation service.
fn service_env(
    env: &HashMap<String, String>,
    name: ServiceName,
    auth: Option<&ServiceAuth>,
) -> HashMap<String, String> {
    let mut env = env.clone();
    if let Some(auth) = auth {
        if let Some(c) = auth.tenancy.credentials(Role::Service(name)) {
            env.insert("SANDMESH_NATS_URL".into(), c.url(&auth.url));
        }
        // Services that read the tenancy file follow its operators as they change (`sandmesh
        // operator add`); without it they get today's scopes.
        if !env.contains_key("SANDMESH_TENANCY_FILE") {
            env.entry("SANDMESH_OPERATOR_SCOPES".into())
                .or_insert_with(|| auth.tenancy.operator_scopes());
        }
    }
    env
}

/// The deployment's accounts and credentials: `tenancy.json` in the data directory, made on
/// first use and kept (so `sandmesh creds` stays valid across restarts).
pub fn load_or_create_tenancy(data_dir: &Path, subjects: &Subjects) -> anyhow::Result<Tenancy> {
    let path = data_dir.join(TENANCY_FILE);
    if path.exists() {
        let mut tenancy = Tenancy::load(&path)?;
        // A data directory made before a service was added (`templates`) gets its user.
        if tenancy.add_missing_services() {
            tenancy.save(&path)?;
        }
        return Ok(tenancy);
    }
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let tenancy = Tenancy::generate(subjects);
    tenancy.save(&path)?;
    eprintln!(
        "sandmesh: generated credentials in {} (tenant `default`, an agent, an operator)",
        path.display()
    );
    Ok(tenancy)
}

/// The services' account file in the data directory.
pub const TENANCY_FILE: &str = "tenancy.json";

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
        let (name, result) = match joined {
            Ok(done) => done,
            Err(e) => ("a service".to_string(), Err(anyhow::Error::new(e))),
        };
        if let Err(e) = result {
            eprintln!("sandmesh: {name} stopped: {e:#}");
            failure.get_or_insert_with(|| anyhow::anyhow!("{name} failed: {e:#}"));
            // One service down means the mesh is not whole: stop the rest cleanly.
            shutdown.cancel();
        }
    }
    failure.map_or(Ok(()), Err)
}

/// The running services and what stopping them needs.
struct Running {
    task: JoinHandle<anyhow::Result<()>>,
    shutdown: CancellationToken,
    grace: Duration,
    executor: Option<ExecutorConfig>,
}

impl Running {
    fn start(services: Services, shutdown: CancellationToken, grace: Duration) -> Self {
        let task = tokio::spawn(run_services(services.futures, shutdown.clone()));
        Self {
            task,
            shutdown,
            grace,
            executor: services.executor,
        }
    }

    /// Fires the token, gives the services the grace period plus [`STOP_MARGIN`], then
    /// removes this node's containers through Docker, whether the executor got to it or not.
    async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let limit = self.grace + STOP_MARGIN;
        eprintln!("sandmesh: stopping (at most {} s)", limit.as_secs());
        let stopped = match tokio::time::timeout(limit, &mut self.task).await {
            Ok(joined) => joined
                .context("the services' task panicked")
                .and_then(|r| r),
            Err(_) => {
                // Dropping the task drops every service future with it.
                self.task.abort();
                Err(anyhow::anyhow!(
                    "the services did not stop within {limit:?} (is NATS reachable?)"
                ))
            }
        };
        if let Some(executor) = &self.executor {
            match tokio::time::timeout(REMOVAL_LIMIT, remove_containers(executor)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => eprintln!("sandmesh: removed {n} sandbox containers left behind"),
                Ok(Err(e)) => eprintln!("sandmesh: cannot remove sandbox containers: {e:#}"),
                Err(_) => eprintln!(
                    "sandmesh: Docker did not remove the sandbox containers within {REMOVAL_LIMIT:?}"
                ),
            }
        }
        stopped
    }
}

/// Removes every container labelled with this executor's node, by the janitor's own sweep.
async fn remove_containers(config: &ExecutorConfig) -> anyhow::Result<usize> {
    let docker = Sandboxes::connect().await?;
    // Removal goes by the node label alone; the mesh only labels containers being created.
    let sandboxes = Sandboxes::new(docker, SandboxSpec::from_config(config, ""));
    Ok(docker_executor::janitor::remove_node(&sandboxes).await)
}

/// Awaits `work`, saying every [`PROGRESS_EVERY`] that it is still `doing` it, so a newcomer
/// never waits in silence.
async fn with_progress<F: Future>(doing: &str, work: F) -> F::Output {
    with_progress_every(doing, PROGRESS_EVERY, work).await
}

/// [`with_progress`], saying so every `every`.
async fn with_progress_every<F: Future>(doing: &str, every: Duration, work: F) -> F::Output {
    let started = Instant::now();
    let mut ticks = tokio::time::interval_at(started + every, every);
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = ticks.tick() => {
                eprintln!("sandmesh: still {doing} ({} s)…", started.elapsed().as_secs());
            }
        }
    }
}

pub async fn serve_one(service: &str) -> anyhow::Result<i32> {
    let config = kit::KitConfig::from_env(&kit::config::ProcessEnv);
    let config = kit::config::exit_on_error(config);
    let _telemetry =
        kit::telemetry::init(service, config.otlp_endpoint.as_deref(), config.log_json);
    let shutdown = kit::shutdown::on_signals();
    let name: ServiceName = match service.parse() {
        Ok(name) => name,
        Err(_) => {
            eprintln!(
                "sandmesh: unknown service {service:?}; one of: {}",
                service_list()
            );
            return Ok(64);
        }
    };
    let services = kit::config::exit_on_error(build(
        &[name],
        &process_env(),
        None,
        &ImageBuilds::default(),
        Faces::default(),
        &shutdown,
    ));
    let running = Running::start(services, shutdown.clone(), config.shutdown_grace);
    shutdown.cancelled().await;
    running.stop().await?;
    Ok(0)
}

pub async fn run(args: UpArgs) -> anyhow::Result<i32> {
    let mut env = process_env();
    if let Some(allow) = &args.network_allow {
        env.insert("SANDMESH_NETWORK_ALLOW".into(), allow.clone());
    }
    let kit_config = kit::config::exit_on_error(kit::KitConfig::from_env(&env));
    let _telemetry = kit::telemetry::init(
        "sandmesh",
        kit_config.otlp_endpoint.as_deref(),
        kit_config.log_json,
    );
    let configured = env
        .get("SANDMESH_NATS_URL")
        .is_some_and(|v| !v.trim().is_empty());
    let mut auth = None;
    let _nats = if configured {
        // An external server (or cluster) with a tenancy file: each service connects as
        // itself, as with the embedded server.
        if let Some(path) = &kit_config.tenancy_file {
            auth = Some(ServiceAuth {
                url: sandmesh_auth::split_url(&kit_config.nats_url).0,
                tenancy: Tenancy::load(path)?,
            });
        }
        None
    } else {
        let tenancy = if args.insecure {
            eprintln!(
                "sandmesh: WARNING: --insecure: NATS runs WITHOUT authentication. Any client can \
                 approve any confirmation and read every tenant's results. Debugging only."
            );
            None
        } else {
            Some(load_or_create_tenancy(
                &args.data_dir,
                &kit_config.subjects,
            )?)
        };
        eprintln!("sandmesh: starting nats-server");
        let server = local_nats::start(
            &args.data_dir.join("nats"),
            args.nats_port,
            tenancy.as_ref(),
        )?;
        eprintln!(
            "sandmesh: started nats-server at {} (data in {})",
            server.url,
            args.data_dir.display()
        );
        env.insert("SANDMESH_NATS_URL".into(), server.url.clone());
        if let Some(tenancy) = tenancy {
            creds::write_all(&args.data_dir, &server.url, &tenancy)?;
            eprintln!(
                "sandmesh: credentials in {}; `sandmesh creds` shows how a program connects",
                creds::creds_dir(&args.data_dir).display()
            );
            auth = Some(ServiceAuth {
                url: server.url.clone(),
                tenancy,
            });
        }
        Some(server)
    };
    let nats_url = env["SANDMESH_NATS_URL"].clone();
    // The admin watches the services come up; the demo runs as the default tenant's agent,
    // the way a user's program would.
    let (watch_url, demo_url) = match &auth {
        Some(a) => {
            let url_as = |role| {
                a.tenancy
                    .credentials(role)
                    .map(|c| c.url(&a.url))
                    .unwrap_or_else(|| a.url.clone())
            };
            let default = Tenant::default_tenant();
            (url_as(Role::Admin), url_as(Role::Agent(&default)))
        }
        None => (nats_url.clone(), nats_url.clone()),
    };
    eprintln!("sandmesh: preparing the sandbox image (built from Debian packages when missing)");
    let image = with_progress(
        "building the sandbox image",
        docker_executor::image::ensure(),
    )
    .await
    .context("building the sandbox image")?;
    env.entry("SANDMESH_EXEC_IMAGE".into()).or_insert(image);
    // The browser and AIO images (Debian's chromium: minutes the first time) build while the
    // mesh already serves `exec`; until each exists its service answers `unavailable`.
    let mut builds = ImageBuilds {
        browser: (!env.contains_key("SANDMESH_BROWSER_IMAGE"))
            .then(|| build_in_background("the browser image", browser_router::image::ensure())),
        aio: (!env.contains_key("SANDMESH_AIO_IMAGE"))
            .then(|| build_in_background("the AIO image", containers::image::AIO.ensure())),
    };
    builds.settle(&mut env).await;
    // No Chromium starts unasked on a laptop: instances are made on first acquire.
    env.entry("SANDMESH_AIO_MIN_INSTANCES".into())
        .or_insert_with(|| "0".into());
    // The console's logins survive a restart of `up` (passwords sealed with the browser's key).
    env.entry("SANDMESH_CONSOLE_STATE_DIR".into())
        .or_insert_with(|| args.data_dir.join("console").display().to_string());
    let console_url = crate::console::url(&env);
    // The gateway acts as each tenant's agent: it reads their credentials from the tenancy
    // file and keeps its API keys beside it (`sandmesh tenant key create`).
    if auth.is_some() && !configured {
        env.entry("SANDMESH_TENANCY_FILE".into())
            .or_insert_with(|| args.data_dir.join(TENANCY_FILE).display().to_string());
    }
    env.entry("SANDMESH_GATEWAY_KEYS_FILE".into())
        .or_insert_with(|| {
            let beside = kit_config.tenancy_file.as_deref().and_then(Path::parent);
            let dir = beside.unwrap_or(&args.data_dir);
            dir.join(::gateway::keys::KEYS_FILE).display().to_string()
        });
    let gateway_url = crate::gateway::url(&env);
    // E2B's SDKs reach the gateway's second listener; a taken port leaves it out, not the mesh.
    let mut faces = Faces::default();
    let e2b = crate::gateway::E2B_FACE;
    let e2b_url = match e2b.listen(&env) {
        Ok(listener) => {
            faces.e2b = listener;
            Some(format!("http://{}", e2b.addr(&env)))
        }
        Err(why) => {
            eprintln!("sandmesh: running without the E2B facade: {why}");
            None
        }
    };
    match &e2b_url {
        Some(_) => env.insert(e2b.var.into(), e2b.addr(&env)),
        None => env.remove(e2b.var),
    };

    let shutdown = kit::shutdown::on_signals();
    let names = up_services(&env, &mut faces);
    let services = kit::config::exit_on_error(build(
        &names,
        &env,
        auth.as_ref(),
        &builds,
        faces,
        &shutdown,
    ));
    let running = Running::start(services, shutdown.clone(), kit_config.shutdown_grace);
    let urls = Urls {
        console: &console_url,
        gateway: &gateway_url,
        e2b: e2b_url.as_deref(),
        shown: &nats_url,
        watch: &watch_url,
        demo: &demo_url,
    };
    let code = tokio::select! {
        code = serve_until_stopped(&urls, &names, &args, &kit_config, &shutdown) => code,
        // A signal (or a failed service) while starting: stop without waiting for readiness.
        _ = shutdown.cancelled() => Ok(0),
    };
    let stopped = running.stop().await;
    let code = code?;
    stopped?;
    Ok(code)
}

/// The URLs `up` uses itself: the one it shows, the admin's (readiness) and the agent's (demo).
struct Urls<'a> {
    /// The operators' console.
    console: &'a str,
    /// The HTTP API.
    gateway: &'a str,
    /// The E2B facade, when it listens.
    e2b: Option<&'a str>,
    shown: &'a str,
    watch: &'a str,
    demo: &'a str,
}

async fn connect(url: &str) -> anyhow::Result<async_nats::Client> {
    let (plain, credentials) = sandmesh_auth::split_url(url);
    let mut options = async_nats::ConnectOptions::new();
    if let Some(c) = credentials {
        options = options.user_and_password(c.user, c.password);
    }
    Ok(options.connect(sandmesh_auth::servers(&plain)).await?)
}

/// Waits until the mesh answers, runs the demo when asked, and then serves until the token
/// fires (at once after `--demo --once`). Returns the exit code.
async fn serve_until_stopped(
    urls: &Urls<'_>,
    names: &[ServiceName],
    args: &UpArgs,
    kit_config: &kit::KitConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<i32> {
    let client = connect(urls.watch).await?;
    wait_until_ready(
        &client,
        names,
        &kit_config.subjects,
        Duration::from_secs(120),
    )
    .await?;
    eprintln!(
        "sandmesh: mesh is up — NATS {}; try `sandmesh exec 'print(1)'`; Ctrl-C stops it",
        urls.shown
    );
    if names.contains(&ServiceName::Console) {
        eprintln!(
            "sandmesh: operators' console at {} — `sandmesh console` says how to log in",
            urls.console
        );
    }
    if names.contains(&ServiceName::Gateway) {
        eprintln!(
            "sandmesh: HTTP API at {} — `sandmesh tenant key create default` makes a key",
            urls.gateway
        );
        if let Some(e2b) = urls.e2b {
            eprintln!(
                "sandmesh: E2B's SDKs: export E2B_API_URL={e2b} E2B_SANDBOX_URL={e2b} \\\n  \
                 E2B_API_KEY=$(sandmesh tenant key create default --e2b | tail -n 1)"
            );
        }
    }
    if args.demo {
        let agent = connect(urls.demo).await?;
        let code = crate::demo::run(&agent, &kit_config.subjects).await?;
        if args.once {
            return Ok(code);
        }
    }
    shutdown.cancelled().await;
    Ok(0)
}

/// Bounded poll until every service answers `$SRV.PING.<name>`.
async fn wait_until_ready(
    client: &async_nats::Client,
    names: &[ServiceName],
    subjects: &Subjects,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    for name in names {
        let answered = async {
            loop {
                let ping = client.request(name.srv_ping(), "".into());
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), ping).await {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    anyhow::bail!("{name} did not come up within {limit:?}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        with_progress(&format!("waiting for {name} to answer"), answered).await?;
    }
    // A service answers `$SRV.PING` as soon as it starts, a moment before its endpoints are
    // served: the first execution must not race them. The risk assessor and the scheduler
    // answer a real request (an error reply counts: it proves the endpoint is there).
    let probes = [
        (
            subjects.risk_assess(),
            serde_json::json!({"content": "print(1)", "content_type": "python"}),
        ),
        (
            subjects.results_get(),
            serde_json::json!({"execution_id": "readiness-probe"}),
        ),
    ];
    for (subject, body) in probes {
        let answered = async {
            loop {
                let ask = client.request(subject.clone(), body.to_string().into());
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), ask).await {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    anyhow::bail!("nothing served {subject} within {limit:?}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        with_progress(&format!("waiting for {subject} to be served"), answered).await?;
    }
    Ok(())
}
