//! `sandmesh up` serves executions as soon as the sandbox image exists, while the browser and
//! AIO images are still being built: the first result does not wait for Chromium.
//! Until an image exists its service answers 503 saying so — and a failed build says why —
//! through the real CLI, as the mesh's own agent.
//!
//! The builds are made slow and failing by the images directory (`SANDMESH_IMAGES_DIR`): its
//! `build.sh` builds the sandbox image with the real script, and the AIO image never while `up`
//! runs; its `build-browser.sh` fails like an apt error would.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{run_bounded, SANDMESH};
use test_support::{eventually, free_port, nats_server_binary, repo_root, require_docker};

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `sandmesh <args>` as the default tenant's agent of the mesh in `data`, bounded.
async fn as_agent(data: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(SANDMESH);
    cmd.args(args)
        .env_remove("SANDMESH_NATS_URL")
        .env("SANDMESH_CREDS", data.join("creds/agent.json"));
    run_bounded(cmd, Duration::from_secs(120)).await
}

#[tokio::test]
async fn up_serves_exec_while_the_browser_and_aio_images_are_still_building() {
    require_docker();
    let images = tempfile::tempdir().unwrap();
    let real = repo_root().join("deploy/images/build.sh");
    script(
        &images.path().join("build.sh"),
        &format!(
            // The AIO "build" lasts as long as `up` does (its parent), then fails.
            "if [ \"$1\" = aio ]; then\n  echo 'installing chromium…' >&2\n  while kill -0 $PPID 2>/dev/null; do sleep 1; done\n  exit 1\nfi\nexec {} \"$@\"",
            real.display()
        ),
    );
    script(
        &images.path().join("build-browser.sh"),
        "echo 'E: apt-get install chromium: exit status 100' >&2\nexit 1",
    );
    let data = tempfile::tempdir().unwrap();
    let log = data.path().join("up.log");
    let mut up = tokio::process::Command::new(SANDMESH)
        .args(["up", "--nats-port", &free_port().to_string()])
        .arg("--data-dir")
        .arg(data.path())
        .env_remove("SANDMESH_NATS_URL")
        .env_remove("SANDMESH_BROWSER_IMAGE")
        .env_remove("SANDMESH_AIO_IMAGE")
        .env("SANDMESH_IMAGES_DIR", images.path())
        .env("SANDMESH_NATS_SERVER", nats_server_binary())
        .current_dir(repo_root())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    eventually(
        "`up` to say the mesh is up",
        Duration::from_secs(300),
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("sandmesh: mesh is up").then_some(())
        },
    )
    .await;

    let exec = as_agent(data.path(), &["exec", "print(6*7)"]).await;
    assert!(
        String::from_utf8_lossy(&exec.stdout).contains("42"),
        "exec is served while the images build: {exec:?}"
    );

    let browse = as_agent(
        data.path(),
        &["browse", "s1", "navigate", "https://example.org"],
    )
    .await;
    let said = String::from_utf8_lossy(&browse.stderr);
    assert!(!browse.status.success(), "{browse:?}");
    assert!(
        said.contains("503")
            && said.contains("the browser image could not be built")
            && said.contains("apt-get install chromium: exit status 100"),
        "browse says why it cannot be served: {said}"
    );

    let aio = as_agent(
        data.path(),
        &[
            "exec",
            "--tier",
            "aio",
            "--session",
            "s1",
            "--lang",
            "shell",
            "echo hi",
        ],
    )
    .await;
    let both = format!(
        "{}{}",
        String::from_utf8_lossy(&aio.stdout),
        String::from_utf8_lossy(&aio.stderr)
    );
    assert!(
        both.contains("the AIO image is still building (") && both.contains(" s so far)"),
        "tier aio says the image is still building: {both}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("sandmesh: building the AIO image in the background")
            && text.contains("sandmesh: building the browser image failed"),
        "the log says what builds in the background and how it went: {text}"
    );

    let pid = up.id().expect("running").to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .is_ok_and(|s| s.success()));
    let stopped = tokio::time::timeout(Duration::from_secs(60), up.wait())
        .await
        .expect("up stops while an image still builds")
        .unwrap();
    assert!(stopped.success(), "{stopped:?}\n{text}");
}
