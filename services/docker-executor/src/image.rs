//! The sandbox image with the supervisor inside, built on demand by `deploy/images/build.sh`
//! (idempotent: about 0.1 s when the image for the same inputs exists).
//!
//! `sandmesh up` and the tests call [`ensure_image`] / [`build_image`] before starting an
//! executor.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the supervisor binary was not found ({0}); build it with `cargo build -p sandmesh-supervisor` or set SANDMESH_SUPERVISOR_BIN")]
    NoSupervisor(String),
    #[error("the image build script was not found at {0} (set SANDMESH_IMAGES_DIR)")]
    NoScript(String),
    #[error("{command} failed: {message}")]
    Failed { command: String, message: String },
}

/// The repository's `deploy/images` (where this crate was built from), or
/// `SANDMESH_IMAGES_DIR`.
pub fn images_dir() -> PathBuf {
    std::env::var_os("SANDMESH_IMAGES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/images"))
}

fn run(mut cmd: Command) -> Result<String, ImageError> {
    let command = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| ImageError::Failed {
        command: command.clone(),
        message: e.to_string(),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        return Err(ImageError::Failed {
            command,
            message: format!(
                "{}:\n{}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Builds (or finds up to date) the sandbox image with `supervisor` installed; returns the
/// image reference (`sandmesh/sandbox:<hash>`).
pub fn build_image(supervisor: &Path) -> Result<String, ImageError> {
    if !supervisor.is_file() {
        return Err(ImageError::NoSupervisor(supervisor.display().to_string()));
    }
    run_build_script("build.sh", &[("SUPERVISOR_BIN", supervisor.as_os_str())])
}

/// Runs one of `deploy/images`' idempotent build scripts (`build.sh`, `build-browser.sh`)
/// with `envs` and returns the image reference it prints last. Blocking.
pub fn run_build_script(
    name: &str,
    envs: &[(&str, &std::ffi::OsStr)],
) -> Result<String, ImageError> {
    let script = images_dir().join(name);
    if !script.is_file() {
        return Err(ImageError::NoScript(script.display().to_string()));
    }
    let mut cmd = Command::new(&script);
    cmd.envs(envs.iter().copied());
    let out = run(cmd)?;
    out.lines()
        .last()
        .map(str::to_string)
        .ok_or_else(|| ImageError::Failed {
            command: script.display().to_string(),
            message: "printed no image reference".into(),
        })
}

/// The supervisor's package and binary (`sandbox/supervisor`).
const SUPERVISOR: &str = "sandmesh-supervisor";

/// Where the supervisor binary is: `SANDMESH_SUPERVISOR_BIN`, next to the running program
/// (cargo puts all of a workspace's binaries in one directory), or this checkout's
/// `target/{release,debug}`.
pub fn find_supervisor() -> Option<PathBuf> {
    const NAME: &str = SUPERVISOR;
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("SANDMESH_SUPERVISOR_BIN") {
        candidates.push(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join(NAME));
            // Test binaries live one level deeper, in target/<profile>/deps.
            if let Some(up) = dir.parent() {
                candidates.push(up.join(NAME));
            }
        }
    }
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    candidates.push(target.join("release").join(NAME));
    candidates.push(target.join("debug").join(NAME));
    candidates.into_iter().find(|p| p.is_file())
}

/// Builds the supervisor of this source checkout (`cargo build --release -p
/// sandmesh-supervisor`, a no-op when it is up to date) and returns its path. The release
/// profile also keeps it clear of the debug build lock a running `cargo test` holds. Blocking.
pub fn build_supervisor() -> Result<PathBuf, ImageError> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args([
        "build",
        "--release",
        "-p",
        SUPERVISOR,
        "--message-format=json-render-diagnostics",
        "--manifest-path",
    ])
    .arg(&manifest);
    let out = run(cmd)?;
    // The artifact messages name the binary's path, wherever CARGO_TARGET_DIR points.
    out.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|m| m.get("executable")?.as_str().map(PathBuf::from))
        .find(|p| p.file_name().is_some_and(|n| n == SUPERVISOR))
        .ok_or_else(|| ImageError::NoSupervisor("cargo build named no executable".into()))
}

/// For `sandmesh up`: finds the supervisor (building it with cargo in a source checkout when
/// it is missing) and builds the image. Blocking; call it from `spawn_blocking` in async code.
pub fn ensure_image() -> Result<String, ImageError> {
    let supervisor = match find_supervisor() {
        Some(p) => p,
        None => build_supervisor()?,
    };
    build_image(&supervisor)
}

/// [`ensure_image`] for async callers (`sandmesh up`): returns the image reference to put in
/// `SANDMESH_EXEC_IMAGE`.
pub async fn ensure() -> Result<String, ImageError> {
    tokio::task::spawn_blocking(ensure_image)
        .await
        .map_err(|e| ImageError::Failed {
            command: "ensure_image".into(),
            message: e.to_string(),
        })?
}
