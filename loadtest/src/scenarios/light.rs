//! `light`: the bubblewrap backend beside its two baselines, in one run: a bare
//! `docker exec` of `print(1)` in a running hardened container, a bare `bwrap` loop on the
//! sandbox image's exported rootfs (the same namespaces and mounts as the executor's
//! sandboxes, without its cgroup, seccomp filter and supervisor), and `print(1)` through the
//! mesh as tier `ephemeral`, which `sandmesh up` sends to the bwrap-executor when bubblewrap is
//! installed (`SANDMESH_EPHEMERAL_BACKEND=auto`).
//!
//! The bare loop and the mesh take turns of [`TURN`] each (mesh, bare, mesh, bare, …) at each
//! concurrency: their throughput ratio is the target, and on a shared machine
//! back-to-back series caught different shares of the background load.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use messages::exec::Language;

use crate::client::exec_sync;
use crate::driver::{alternate, Load, Sample, TurnOp};
use crate::programs::tiny;
use crate::scenarios::exec::{self, tier_request, ExecTier};
use crate::scenarios::Ctx;

/// One turn of the mesh or of the bare loop: long enough for thousands of sandboxes at c=4,
/// short enough that a background build's burst falls on both.
const TURN: Duration = Duration::from_secs(4);

/// Where the bwrap-executor exports rootfs trees (its default `SANDMESH_BWRAP_STATE_DIR`).
const STATE_DIR: &str = "/var/tmp/sandmesh-bwrap";
/// The sandbox uid, inside and (when root) outside.
const UID: &str = "10001";

/// The exported rootfs of `image` (the mesh's bwrap-executor made it at start).
async fn rootfs(ctx: &Ctx, image: &str) -> anyhow::Result<PathBuf> {
    let docker = ctx.docker.as_ref().context("Docker is not reachable")?;
    let id = docker
        .inspect_image(image)
        .await
        .with_context(|| format!("inspecting {image}"))?
        .id
        .unwrap_or_default();
    let dir = Path::new(STATE_DIR)
        .join("rootfs")
        .join(id.trim_start_matches("sha256:"));
    anyhow::ensure!(
        dir.is_dir(),
        "{} is missing: is the mesh's bwrap-executor running (bubblewrap installed)?",
        dir.display()
    );
    Ok(dir)
}

/// One bare sandbox running `python3 -c 'print(1)'`, dropping to the sandbox uid first when
/// root, as the executor does.
async fn bare_bwrap(rootfs: &Path) -> std::io::Result<(bool, String)> {
    let root = nix_is_root();
    let mut cmd = if root {
        let mut c = tokio::process::Command::new("setpriv");
        c.args([
            &format!("--reuid={UID}"),
            &format!("--regid={UID}"),
            "--clear-groups",
            "--",
            "bwrap",
        ]);
        c
    } else {
        tokio::process::Command::new("bwrap")
    };
    cmd.args([
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--uid",
        UID,
        "--gid",
        UID,
        "--ro-bind",
    ])
    .arg(rootfs)
    .args([
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/workspace",
        "--chdir",
        "/workspace",
        "python3",
        "-c",
        "print(1)",
    ])
    .env_clear()
    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    .stdin(std::process::Stdio::null());
    let out = cmd.output().await?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// The three series per concurrency: Docker baseline, then bare bwrap and the mesh's
/// ephemeral tier taking turns.
pub async fn light(
    ctx: &mut Ctx,
    image: &str,
    concurrency: &[usize],
    load: Load,
) -> anyhow::Result<()> {
    exec::baseline(ctx, image, &[Language::Python], concurrency, load).await?;
    mesh_beside_bare_bwrap(ctx, image, concurrency, load).await
}

/// One bare sandbox's sample.
async fn bare_sample(rootfs: &Path) -> Sample {
    let start = Instant::now();
    match bare_bwrap(rootfs).await {
        Ok((true, out)) if out == "1\n" => Sample::timed(start.elapsed(), "ok"),
        Ok((true, out)) => Sample::timed(start.elapsed(), "wrong_output").with_detail(out),
        Ok((false, out)) => Sample::timed(start.elapsed(), "failed").with_detail(out),
        Err(e) => Sample::failed("err:spawn", e.to_string()),
    }
}

/// At each concurrency, `print(1)` through the mesh as tier ephemeral
/// (`exec/python/ephemeral/sync/c<c>`) and the bare `bwrap` loop, the light backend's floor
/// (`bare-bwrap/python/c<c>`), in alternating turns of [`TURN`] until each had
/// `load.duration`.
pub async fn mesh_beside_bare_bwrap(
    ctx: &mut Ctx,
    image: &str,
    concurrency: &[usize],
    load: Load,
) -> anyhow::Result<()> {
    let rootfs = Arc::new(rootfs(ctx, image).await?);
    let (code, expect, _) = tiny(Language::Python);
    let request = tier_request(Language::Python, code, ExecTier::Ephemeral, None);
    // One unmeasured run of each: page cache, connections.
    bare_bwrap(&rootfs).await?;
    exec_sync(&ctx.mesh, &request, Some(expect)).await;
    let mesh = ctx.mesh.clone();
    let through_mesh: TurnOp = Arc::new(move |_, _| {
        let (mesh, request) = (mesh.clone(), request.clone());
        Box::pin(async move { exec_sync(&mesh, &request, Some(expect)).await })
    });
    let bare: TurnOp = Arc::new(move |_, _| {
        let rootfs = rootfs.clone();
        Box::pin(async move { bare_sample(&rootfs).await })
    });
    for &c in concurrency {
        let mesh_name = format!("exec/python/ephemeral/sync/c{c}");
        let bare_name = format!("bare-bwrap/python/c{c}");
        let series = [
            (mesh_name.clone(), through_mesh.clone()),
            (bare_name.clone(), bare.clone()),
        ];
        let runs = alternate(&series, load.with_concurrency(c), TURN).await;
        let [mesh_run, bare_run] = <[_; 2]>::try_from(runs).expect("one run per series");
        ctx.push(mesh_run.report(&mesh_name).tagged(
            Some("python"),
            Some("ephemeral"),
            Some("sync"),
        ));
        ctx.push(
            bare_run
                .report(&bare_name)
                .tagged(Some("python"), None, None),
        );
    }
    Ok(())
}
