//! `light`: the bubblewrap backend (issue 18) beside its two baselines, in one run: a bare
//! `docker exec` of `print(1)` in a running hardened container, a bare `bwrap` loop on the
//! sandbox image's exported rootfs (the same namespaces and mounts as the executor's
//! sandboxes, without its cgroup, seccomp filter and supervisor), and `print(1)` through the
//! mesh as tier `ephemeral`, which `sandmesh up` sends to the bwrap-executor when bubblewrap is
//! installed (`SANDMESH_EPHEMERAL_BACKEND=auto`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use messages::exec::Language;

use crate::driver::{drive, Load, Sample};
use crate::scenarios::exec::{self, ExecTier, Mode};
use crate::scenarios::Ctx;

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

/// The three series per concurrency: Docker baseline, bare bwrap, the mesh's ephemeral tier.
pub async fn light(
    ctx: &mut Ctx,
    image: &str,
    concurrency: &[usize],
    load: Load,
) -> anyhow::Result<()> {
    exec::baseline(ctx, image, &[Language::Python], concurrency, load).await?;
    bare_bwrap_series(ctx, image, concurrency, load).await?;
    exec::exec(
        ctx,
        &[Language::Python],
        &[ExecTier::Ephemeral],
        &[Mode::Sync],
        concurrency,
        load,
    )
    .await
}

/// The bare `bwrap` loop at each concurrency (series `bare-bwrap/python/c<c>`): the light
/// backend's floor.
pub async fn bare_bwrap_series(
    ctx: &mut Ctx,
    image: &str,
    concurrency: &[usize],
    load: Load,
) -> anyhow::Result<()> {
    let rootfs = rootfs(ctx, image).await?;
    // One unmeasured run: page cache.
    bare_bwrap(&rootfs).await?;
    for &c in concurrency {
        let name = format!("bare-bwrap/python/c{c}");
        let root = rootfs.clone();
        let run = drive(&name, load.with_concurrency(c), move |_, _| {
            let root = root.clone();
            async move {
                let start = Instant::now();
                match bare_bwrap(&root).await {
                    Ok((true, out)) if out == "1\n" => Sample::timed(start.elapsed(), "ok"),
                    Ok((true, out)) => {
                        Sample::timed(start.elapsed(), "wrong_output").with_detail(out)
                    }
                    Ok((false, out)) => Sample::timed(start.elapsed(), "failed").with_detail(out),
                    Err(e) => Sample::failed("err:spawn", e.to_string()),
                }
            }
        })
        .await;
        ctx.push(run.report(&name).tagged(Some("python"), None, None));
    }
    Ok(())
}
