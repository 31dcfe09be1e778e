//! docker-compose.yaml, scaled: the compose file builds the mesh image from this test build's
//! own `sandmesh` binary (no release build, no registry), starts NATS with authentication and
//! every service with two risk-assessors and two docker-executors sharing the host's Docker,
//! checks that `$SRV.PING` lists each instance, runs executions through it (single-use ones, a
//! session whose write an operator approves, the CLI's, one whose network policy lets it reach
//! NATS's monitoring port through an executor's egress proxy), and tears it down
//! leaving no container, network, volume or image of the project, and no sandbox container of
//! its executors. Real Docker, real docker-compose, real nats-server.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use messages::confirm::{ConfirmDecide, ConfirmList, ConfirmScope, ConfirmState};
use messages::exec::{ExecRequest, ExecStatus, Language};
use messages::network::NetworkPolicy;
use messages::tenancy::Tenant;
use messages::{ServiceName, Subjects};
use sandmesh_auth::{Role, Tenancy};
use sandmesh_client::MeshClient;
use test_support::{eventually, free_port, nats_server_binary, repo_root, require_docker};

use crate::common::{containers, run_bounded, SANDMESH};

/// How the machine runs compose: the v1 program or the v2 plugin.
fn compose_program() -> Vec<String> {
    for program in [&["docker-compose"][..], &["docker", "compose"]] {
        let ok = Command::new(program[0])
            .args(&program[1..])
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return program.iter().map(|s| s.to_string()).collect();
        }
    }
    panic!(
        "neither `docker-compose` nor `docker compose` works; install one (Debian: apt-get \
         install docker-compose) — this test runs the real docker-compose.yaml"
    );
}

/// One compose project of this test: a unique name, its environment, and teardown on drop
/// (so a failing test leaves nothing behind either).
struct Project {
    program: Vec<String>,
    name: String,
    env: Vec<(String, String)>,
    /// The compose files: the repository's, then this test's labels (see [`Project::label`]).
    files: Vec<PathBuf>,
    down: bool,
}

impl Project {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.program[0]);
        cmd.args(&self.program[1..])
            .arg("--project-name")
            .arg(&self.name)
            .args(self.files.iter().flat_map(|f| [Path::new("--file"), f]))
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            // The classic builder: FROM the local-only base never contacts a registry.
            .env("DOCKER_BUILDKIT", "0")
            .current_dir(repo_root());
        cmd
    }

    /// Adds a compose file that labels every container, network and volume of the project (and
    /// the sandboxes its executors make) with this test run: `scripts/test.sh` removes a dead
    /// run's labelled resources, so a test killed by its timeout, whose teardown never runs,
    /// leaves no restarting mesh behind. Without `SANDMESH_TEST_RUN` (a plain `cargo test`)
    /// there is nothing to label with.
    async fn label(&mut self, dir: &Path) {
        let Ok(run) = std::env::var("SANDMESH_TEST_RUN") else {
            return;
        };
        let limit = Duration::from_secs(60);
        let services = self.run(&["config", "--services"], limit).await;
        let volumes = self.run(&["config", "--volumes"], limit).await;
        let (services, volumes) = (services.lines(), volumes.lines());
        let label = format!("      {}: \"{run}\"\n", ::containers::LABEL_TEST_RUN);
        let mut yaml = String::from("services:\n");
        assert!(
            services.clone().count() > 0,
            "compose config lists no service"
        );
        for service in services {
            yaml += &format!("  {service}:\n    labels:\n{label}");
            yaml += &format!("    environment:\n      SANDMESH_TEST_RUN: \"{run}\"\n");
        }
        yaml += &format!("networks:\n  default:\n    labels:\n{label}volumes:\n");
        for volume in volumes {
            yaml += &format!("  {volume}:\n    labels:\n{label}");
        }
        let file = dir.join("test-run.yaml");
        std::fs::write(&file, yaml).unwrap();
        self.files.push(file);
    }

    async fn run(&self, args: &[&str], limit: Duration) -> String {
        let out = run_bounded(self.command(args), limit).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "compose {args:?} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// `down` with the volumes and the project's image; idempotent.
    fn down_blocking(&mut self) -> std::process::Output {
        self.down = true;
        self.command(&["down", "--volumes", "--rmi", "all", "--remove-orphans"])
            .output()
            .expect("running compose down")
    }

    /// The project's resources of one kind (`ps -a`, `network ls`, `volume ls`) that Docker
    /// still has.
    fn leftovers(&self, kind: &[&str]) -> Vec<String> {
        let label = format!("label=com.docker.compose.project={}", self.name);
        let out = Command::new("docker")
            .args(kind)
            .args(["--quiet", "--filter", &label])
            .output()
            .expect("docker");
        assert!(out.status.success(), "docker {kind:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        if !self.down {
            let out = self.down_blocking();
            eprintln!("compose down after a failure: {out:?}");
        }
    }
}

/// The mesh image's build context: deploy/compose/Dockerfile and the two binaries, the
/// `sandmesh` of this test build (debug symbols stripped, as scripts/compose-up.sh does).
fn build_context(dir: &Path) {
    std::fs::copy(
        repo_root().join("deploy/compose/Dockerfile"),
        dir.join("Dockerfile"),
    )
    .unwrap();
    std::fs::copy(SANDMESH, dir.join("sandmesh")).unwrap();
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg(dir.join("sandmesh"))
        .status();
    assert!(
        stripped.is_ok_and(|s| s.success()),
        "strip (binutils) is needed to keep the image small"
    );
    std::fs::copy(nats_server_binary(), dir.join("nats-server")).unwrap();
}

fn python(code: &str, session: Option<&str>) -> ExecRequest {
    ExecRequest {
        execution_id: Some(messages::new_id()),
        session_id: session.map(str::to_string),
        language: Language::Python,
        code: code.into(),
        ..Default::default()
    }
}

/// Instances answering `$SRV.PING`, by service name.
async fn instances(admin: &MeshClient) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_service: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let answers = admin
        .status()
        .ping(None, Duration::from_millis(750))
        .await
        .unwrap_or_default();
    for instance in answers {
        by_service
            .entry(instance.service)
            .or_default()
            .insert(instance.instance_id);
    }
    by_service
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_scales_runs_executions_and_leaves_nothing_behind() {
    require_docker();
    let program = compose_program();
    let sandbox_image = tokio::task::spawn_blocking(docker_executor::image::ensure_image)
        .await
        .unwrap()
        .expect("the sandbox image (deploy/images/build.sh)");
    let context = tempfile::tempdir().unwrap();
    build_context(context.path());
    let name = format!(
        "sandmesh-compose-{}",
        messages::new_id().to_ascii_lowercase()
    );
    let port = free_port();
    let mut project = Project {
        program,
        env: vec![
            ("SANDMESH_MESH_CONTEXT".into(), path(context.path())),
            // The project's own tag: `down --rmi all` removes exactly this image.
            ("SANDMESH_MESH_TAG".into(), name.clone()),
            ("SANDMESH_EXEC_IMAGE".into(), sandbox_image),
            ("SANDMESH_NATS_PORT".into(), port.to_string()),
            // The ceiling for the egress check: names `nats` and Docker's private ranges.
            (
                "SANDMESH_NETWORK_ALLOW".into(),
                "nats,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16".into(),
            ),
            ("SANDMESH_NETWORK_PORTS".into(), "8222".into()),
        ],
        name,
        files: vec![repo_root().join("docker-compose.yaml")],
        down: false,
    };
    project.label(context.path()).await;

    project
        .run(&["build", "auth"], Duration::from_secs(300))
        .await;
    project
        .run(
            &[
                "up",
                "--detach",
                "--scale",
                "risk-assessor=2",
                "--scale",
                "docker-executor=2",
            ],
            Duration::from_secs(300),
        )
        .await;

    // The credentials `tenant init` wrote into the project's volume.
    let tenancy = project
        .run(
            &["exec", "-T", "nats", "cat", "/auth/tenancy.json"],
            Duration::from_secs(60),
        )
        .await;
    let tenancy: Tenancy = serde_json::from_str(&tenancy).expect("tenancy.json");
    let server = format!("nats://127.0.0.1:{port}");
    let url = |role| {
        tenancy
            .credentials(role)
            .expect("credentials for the role")
            .url(&server)
    };
    let admin_url = url(Role::Admin);
    let tenant = Tenant::default_tenant();
    let agent_url = url(Role::Agent(&tenant));
    let operator_url = url(Role::Operator("operator"));
    let admin = MeshClient::new(test_support::connect(&admin_url).await, Subjects::default());

    // Every instance answers $SRV.PING: two risk-assessors and two executors, one of the rest.
    let expected = [
        (ServiceName::RiskAssessor, 2),
        (ServiceName::DockerExecutor, 2),
        (ServiceName::Scheduler, 1),
        (ServiceName::Confirmation, 1),
        (ServiceName::Templates, 1),
        (ServiceName::WorkspaceStore, 1),
    ];
    let listed = eventually(
        "every instance to answer $SRV.PING",
        Duration::from_secs(180),
        || async {
            let listed = instances(&admin).await;
            let complete = expected
                .iter()
                .all(|(s, n)| listed.get(s.as_str()).map(BTreeSet::len) == Some(*n));
            complete.then_some(listed)
        },
    )
    .await;
    let executors = listed[ServiceName::DockerExecutor.as_str()].clone();

    // Executions through the scaled mesh, as the default tenant's agent.
    let agent = MeshClient::new(test_support::connect(&agent_url).await, Subjects::default())
        .with_timeout(Duration::from_secs(60));
    let runs = (0..12).map(|i| {
        let agent = agent.clone();
        async move {
            agent
                .exec()
                .exec(&python(&format!("print({i} * 7)"), None))
                .await
        }
    });
    let results = futures::future::join_all(runs).await;
    let mut nodes = BTreeSet::new();
    for (i, result) in results.into_iter().enumerate() {
        let result = result.expect("an execution through compose");
        assert_eq!(
            (result.status, result.stdout.as_str()),
            (ExecStatus::Ok, format!("{}\n", i * 7).as_str()),
            "{result:?}"
        );
        nodes.extend(result.node.clone());
    }
    assert!(
        nodes.is_subset(&executors),
        "results name executors {nodes:?}, PING lists {executors:?}"
    );
    // A session keeps its files between executions (its container lives on one executor).
    // Writing one asks a person: an operator approves it through the confirmation service.
    let operator = MeshClient::new(
        test_support::connect(&operator_url).await,
        Subjects::default(),
    );
    let session = format!("compose-{}", messages::new_id().to_ascii_lowercase());
    let write = python("open('note', 'w').write('kept')", Some(&session));
    let execution_id = write.execution_id.clone().unwrap();
    let writing = tokio::spawn({
        let agent = agent.clone();
        async move {
            agent
                .exec()
                .exec_timeout(&write, Duration::from_secs(120))
                .await
        }
    });
    let pending = eventually(
        "the write's confirmation",
        Duration::from_secs(60),
        || async {
            let list = ConfirmList {
                state: Some(ConfirmState::Pending),
                ..Default::default()
            };
            let listed = operator.confirm().list(&list).await.ok()?;
            listed
                .into_iter()
                .find(|c| {
                    c.execution_id
                        .as_deref()
                        .is_some_and(|e| e.ends_with(&execution_id))
                })
                .map(|c| c.id)
        },
    )
    .await;
    let approve = ConfirmDecide {
        id: pending,
        approve: true,
        by: "compose test".into(),
        reason: None,
        scope: ConfirmScope::Once,
        by_account: None,
    };
    operator
        .confirm()
        .decide(&approve)
        .await
        .expect("the operator's approval");
    let first = writing.await.unwrap().expect("the approved write");
    assert_eq!(first.status, ExecStatus::Ok, "{first:?}");
    let read = python("print(open('note').read())", Some(&session));
    let second = agent.exec().exec(&read).await.unwrap();
    assert_eq!(
        (second.status, second.stdout.as_str()),
        (ExecStatus::Ok, "kept\n"),
        "{second:?}"
    );
    assert_eq!(
        first.node, second.node,
        "the session moved between executors"
    );
    // The CLI, as a user runs it against the published port.
    let mut cli = Command::new(SANDMESH);
    cli.args(["exec", "print(6 * 7)"])
        .env("SANDMESH_NATS_URL", &agent_url);
    let out = run_bounded(cli, Duration::from_secs(60)).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42", "{out:?}");
    // Egress through an executor's proxy, whose socket directory the host's Docker binds into
    // the sandbox from the path it has in the executor's container: NATS's monitoring port,
    // by name, within the ceiling the scheduler was given.
    let subnet = docker_output(&[
        "network",
        "inspect",
        &format!("{}_default", project.name),
        "--format",
        "{{(index .IPAM.Config 0).Subnet}}",
    ]);
    let mut fetch = python(
        "import urllib.request\n\
         urllib.request.proxy_bypass = lambda host: False\n\
         print(urllib.request.urlopen('http://nats:8222/healthz', timeout=10).read().decode())",
        None,
    );
    fetch.network = Some(NetworkPolicy {
        allow_domains: vec!["nats".into()],
        allow_cidrs: vec![subnet],
        ports: Some(vec![8222]),
        ..Default::default()
    });
    let fetched = agent.exec().exec(&fetch).await.unwrap();
    assert_eq!(
        (fetched.status, fetched.stdout.trim()),
        (ExecStatus::Ok, r#"{"status":"ok"}"#),
        "{fetched:?}"
    );
    let contacted = fetched.network.as_ref().map(|n| n.contacted.len());
    assert_eq!(contacted, Some(1), "{:?}", fetched.network);
    drop((agent, operator, admin));
    eprintln!("$SRV.PING: {listed:?}; single-use runs went to {nodes:?}");

    // What the project holds while it runs, found as the leftover check below looks for it
    // (so that check cannot pass by finding nothing ever).
    let kinds = [&["ps", "--all"][..], &["network", "ls"], &["volume", "ls"]];
    for kind in kinds {
        assert!(
            !project.leftovers(kind).is_empty(),
            "docker {kind:?} lists nothing of the project"
        );
    }

    let out = tokio::task::spawn_blocking(move || {
        let out = project.down_blocking();
        (project, out)
    })
    .await
    .unwrap();
    let (project, down) = out;
    assert!(down.status.success(), "compose down: {down:?}");
    for kind in kinds {
        let left = project.leftovers(kind);
        assert!(left.is_empty(), "docker {kind:?} still lists {left:?}");
    }
    let image = format!("sandmesh/mesh:{}", project.name);
    let inspect = Command::new("docker")
        .args(["image", "inspect", &image])
        .output()
        .unwrap();
    assert!(!inspect.status.success(), "{image} is still there");
    for node in &executors {
        let left = containers(&[format!("sandmesh.node={node}")]);
        assert!(
            left.is_empty(),
            "sandboxes of executor {node} left: {left:?}"
        );
    }
}

fn docker_output(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker");
    assert!(out.status.success(), "docker {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn path(p: &Path) -> String {
    PathBuf::from(p).display().to_string()
}
