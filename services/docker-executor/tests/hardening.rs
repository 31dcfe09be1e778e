//! The cheap conformance test of the hardening: create a sandbox container through
//! the executor's only creation path and assert every hardening field Docker reports back,
//! then look at the same controls from inside.

use std::collections::HashMap;

use bollard::query_parameters::InspectContainerOptions;
use docker_executor::config::ExecutorConfig;
use docker_executor::docker::{
    ContainerId, ContainerKind, ContainerLimits, SandboxSpec, Sandboxes,
};
use docker_executor::probe::exec_capture;

#[tokio::test]
async fn a_sandbox_container_carries_every_hardening_field() {
    let image = crate::common::image();
    let node = crate::common::unique_node("hard");
    let env = HashMap::from([
        ("SANDMESH_INSTANCE_ID".to_string(), node.clone()),
        ("SANDMESH_EXEC_IMAGE".to_string(), image.to_string()),
    ]);
    let config = ExecutorConfig::from_env(&env).unwrap();
    let docker = Sandboxes::connect().await.unwrap();
    let sandboxes = Sandboxes::new(docker.clone(), SandboxSpec::from_config(&config, "mesh-t"));
    let limits = ContainerLimits {
        memory_mb: 192,
        cpus: 0.5,
        pids: 48,
    };
    let name = sandboxes.new_name();
    let uid = sandboxes.uids.take().expect("a uid of the node's range");
    let uid = uid.uid();
    sandboxes
        .start(
            ContainerId { name: &name, uid },
            ContainerKind::Session,
            Some("s-hard"),
            limits,
            &[],
            None,
        )
        .await
        .unwrap();
    let inspect = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await;
    let inside = exec_capture(
        &docker,
        &name,
        &["bash", "-c", "id -u; id -g; grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd):' /proc/self/status; ls /sys/class/net"],
    )
    .await;
    sandboxes.remove(&name).await;
    let inspect = inspect.unwrap();
    let inside = inside.unwrap();

    let host = inspect.host_config.expect("host config");
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert!(host.cap_add.unwrap_or_default().is_empty());
    let security = host.security_opt.unwrap_or_default();
    assert!(
        security.contains(&"no-new-privileges:true".to_string()),
        "{security:?}"
    );
    assert!(
        !security.iter().any(|o| o.contains("unconfined")),
        "seccomp/apparmor must never be unconfined: {security:?}"
    );
    assert_eq!(host.readonly_rootfs, Some(true));
    let tmpfs = host.tmpfs.expect("tmpfs");
    for (path, size) in [
        ("/tmp", config.node.tmp_mb),
        ("/workspace", config.node.workspace_mb),
    ] {
        let opts = tmpfs
            .get(path)
            .unwrap_or_else(|| panic!("no tmpfs at {path}"));
        for want in [
            "exec",
            "nosuid",
            &format!("uid={uid}"),
            &format!("gid={uid}"),
            &format!("size={size}m"),
        ] {
            assert!(
                opts.split(',').any(|o| o == want),
                "{path}: {opts} lacks {want}"
            );
        }
    }
    assert_eq!(host.pids_limit, Some(48));
    assert_eq!(host.memory, Some(192 << 20));
    assert_eq!(
        host.memory_swap, host.memory,
        "no swap beyond the memory limit"
    );
    assert_eq!(host.nano_cpus, Some(500_000_000));
    let ulimits: HashMap<String, (i64, i64)> = host
        .ulimits
        .unwrap_or_default()
        .into_iter()
        .map(|u| (u.name.unwrap(), (u.soft.unwrap(), u.hard.unwrap())))
        .collect();
    let nofile = config.node.nofile as i64;
    assert_eq!(ulimits.get("nofile"), Some(&(nofile, nofile)));
    let fsize = (config.node.fsize_mb << 20) as i64;
    assert_eq!(ulimits.get("fsize"), Some(&(fsize, fsize)));
    assert_eq!(ulimits.get("core"), Some(&(0, 0)));
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.privileged, Some(false));
    // The supervisor is the init (`keep`), not Docker's.
    assert_eq!(host.init, Some(false));
    assert_eq!(
        inspect.config.as_ref().and_then(|c| c.cmd.clone()),
        Some(vec![
            "/usr/local/bin/sandmesh-supervisor".to_string(),
            "keep".to_string()
        ])
    );
    assert_eq!(host.log_config.and_then(|l| l.typ).as_deref(), Some("none"));
    assert!(host.binds.unwrap_or_default().is_empty(), "no host paths");
    assert!(host.mounts.unwrap_or_default().is_empty(), "no mounts");
    assert!(host.devices.unwrap_or_default().is_empty(), "no devices");
    for (what, mode) in [
        ("pid", host.pid_mode.unwrap_or_default()),
        ("ipc", host.ipc_mode.unwrap_or_default()),
        ("userns", host.userns_mode.unwrap_or_default()),
        ("uts", host.uts_mode.unwrap_or_default()),
    ] {
        assert_ne!(mode, "host", "{what} namespace must not be the host's");
    }
    assert!(
        inspect.log_path.unwrap_or_default().is_empty(),
        "no log file"
    );

    let cfg = inspect.config.expect("config");
    assert!(config.uids.contains(uid), "{uid} of {}", config.uids);
    assert_eq!(cfg.user, Some(format!("{uid}:{uid}")));
    assert_eq!(cfg.network_disabled, Some(true));
    let labels = cfg.labels.unwrap_or_default();
    assert_eq!(labels.get("sandmesh").map(String::as_str), Some("1"));
    assert_eq!(labels.get("sandmesh.node"), Some(&node));
    assert_eq!(
        labels.get("sandmesh.kind").map(String::as_str),
        Some("session")
    );
    assert_eq!(
        labels.get("sandmesh.session").map(String::as_str),
        Some("s-hard")
    );
    assert_eq!(
        labels.get("sandmesh.mesh").map(String::as_str),
        Some("mesh-t")
    );
    let env = cfg.env.unwrap_or_default();
    assert!(
        !env.iter()
            .any(|e| e.starts_with("SANDMESH") || e.contains("NATS")),
        "no configuration leaks into the sandbox: {env:?}"
    );

    let lines: Vec<&str> = inside.stdout.lines().collect();
    let uid = uid.to_string();
    assert_eq!(&lines[..2], &[&uid, &uid], "{}", inside.stdout);
    assert!(
        inside.stdout.contains("NoNewPrivs:\t1"),
        "{}",
        inside.stdout
    );
    assert!(
        inside.stdout.contains("Seccomp:\t2"),
        "seccomp filter mode: {}",
        inside.stdout
    );
    assert!(
        inside.stdout.contains("CapEff:\t0000000000000000"),
        "{}",
        inside.stdout
    );
    assert!(
        inside.stdout.contains("CapBnd:\t0000000000000000"),
        "{}",
        inside.stdout
    );
    assert_eq!(
        lines.last(),
        Some(&"lo"),
        "only loopback: {}",
        inside.stdout
    );
}
