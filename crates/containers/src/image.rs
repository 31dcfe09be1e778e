//! The project's images, built on demand by `deploy/images/build.sh` (idempotent: about
//! 0.1 s when the image for the same inputs exists). Each image carries one binary of this
//! workspace as its last layer: the sandbox image the supervisor, the AIO image the agent.
//!
//! `sandmesh up` and the tests call [`LocalImage::ensure`] / [`LocalImage::build`] before
//! starting a service that needs the image.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the {package} binary was not found ({path}); build it with `cargo build -p {package}` or set {env}")]
    NoBinary {
        package: &'static str,
        env: &'static str,
        path: String,
    },
    #[error("the image build script was not found at {0} (set SANDMESH_IMAGES_DIR)")]
    NoScript(String),
    #[error("{command} failed: {message}")]
    Failed { command: String, message: String },
}

/// One image of `deploy/images` and the binary it carries.
#[derive(Debug, Clone, Copy)]
pub struct LocalImage {
    /// `build.sh`'s argument (`sandbox`, `aio`).
    pub target: &'static str,
    /// The cargo package and binary name (they are the same).
    pub package: &'static str,
    /// `build.sh`'s variable for the binary's path.
    pub build_var: &'static str,
    /// The variable that points at a prebuilt binary.
    pub env: &'static str,
}

/// The sandbox image with `sandmesh-supervisor` (docker-executor).
pub const SANDBOX: LocalImage = LocalImage {
    target: "sandbox",
    package: "sandmesh-supervisor",
    build_var: "SUPERVISOR_BIN",
    env: "SANDMESH_SUPERVISOR_BIN",
};

/// The AIO-compatible image with `sandmesh-aio-agent` (aio-pool).
pub const AIO: LocalImage = LocalImage {
    target: "aio",
    package: "sandmesh-aio-agent",
    build_var: "AGENT_BIN",
    env: "SANDMESH_AIO_AGENT_BIN",
};

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

/// Runs one of `deploy/images`' idempotent build scripts (`build.sh`, `build-browser.sh`)
/// with `args` and `envs`; returns the image reference it prints last. Blocking.
pub fn run_script(
    name: &str,
    args: &[&str],
    envs: &[(&str, &std::ffi::OsStr)],
) -> Result<String, ImageError> {
    let script = images_dir().join(name);
    if !script.is_file() {
        return Err(ImageError::NoScript(script.display().to_string()));
    }
    let mut cmd = Command::new(&script);
    cmd.args(args).envs(envs.iter().copied());
    let out = run(cmd)?;
    out.lines()
        .last()
        .map(str::to_string)
        .ok_or_else(|| ImageError::Failed {
            command: script.display().to_string(),
            message: "printed no image reference".into(),
        })
}

impl LocalImage {
    fn no_binary(&self, path: String) -> ImageError {
        ImageError::NoBinary {
            package: self.package,
            env: self.env,
            path,
        }
    }

    /// Builds (or finds up to date) the image with `binary` installed; returns the image
    /// reference (`sandmesh/<target>:<hash>`). Blocking.
    pub fn build(&self, binary: &Path) -> Result<String, ImageError> {
        if !binary.is_file() {
            return Err(self.no_binary(binary.display().to_string()));
        }
        run_script(
            "build.sh",
            &[self.target],
            &[(self.build_var, binary.as_os_str())],
        )
    }

    /// Where the binary is: the `env` variable, next to the running program (cargo puts all
    /// of a workspace's binaries in one directory), or this checkout's `target/{release,debug}`.
    pub fn find_binary(&self) -> Option<PathBuf> {
        let name = self.package;
        let mut candidates = Vec::new();
        if let Some(p) = std::env::var_os(self.env) {
            candidates.push(PathBuf::from(p));
        }
        if let Ok(exe) = std::env::current_exe() {
            if let Some(dir) = exe.parent() {
                candidates.push(dir.join(name));
                // Test binaries live one level deeper, in target/<profile>/deps.
                if let Some(up) = dir.parent() {
                    candidates.push(up.join(name));
                }
            }
        }
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        candidates.push(target.join("release").join(name));
        candidates.push(target.join("debug").join(name));
        candidates.into_iter().find(|p| p.is_file())
    }

    /// The binary of this source checkout, up to date: the one the `env` variable names when
    /// it is set (`scripts/test.sh` builds the debug programs first and names them, so the
    /// tests' images carry the same binary as the meshes' and nothing compiles twice), else a
    /// `cargo build --release -p <package>` (a no-op when it is up to date; the release profile
    /// keeps it clear of the debug build lock a running `cargo test` holds). Blocking.
    pub fn build_binary(&self) -> Result<PathBuf, ImageError> {
        if let Some(named) = std::env::var_os(self.env) {
            let named = PathBuf::from(named);
            if !named.is_file() {
                return Err(self.no_binary(named.display().to_string()));
            }
            return Ok(named);
        }
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args([
            "build",
            "--release",
            "-p",
            self.package,
            "--message-format=json-render-diagnostics",
            "--manifest-path",
        ])
        .arg(&manifest);
        let out = run(cmd)?;
        // The artifact messages name the binary's path, wherever CARGO_TARGET_DIR points.
        out.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter_map(|m| m.get("executable")?.as_str().map(PathBuf::from))
            .find(|p| p.file_name().is_some_and(|n| n == self.package))
            .ok_or_else(|| self.no_binary("cargo build named no executable".into()))
    }

    /// For `sandmesh up`: finds the binary (building it with cargo in a source checkout when
    /// it is missing) and builds the image. Blocking; call it from `spawn_blocking`.
    pub fn ensure_blocking(&self) -> Result<String, ImageError> {
        let binary = match self.find_binary() {
            Some(p) => p,
            None => self.build_binary()?,
        };
        self.build(&binary)
    }

    /// [`LocalImage::ensure_blocking`] for async callers: the image reference.
    pub async fn ensure(self) -> Result<String, ImageError> {
        tokio::task::spawn_blocking(move || self.ensure_blocking())
            .await
            .map_err(|e| ImageError::Failed {
                command: format!("ensure the {} image", self.target),
                message: e.to_string(),
            })?
    }
}
