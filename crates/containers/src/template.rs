//! Template images: the sandbox image plus a template's Debian,
//! PyPI and npm packages, installed at build time so the sandbox never needs the network to
//! import them. Content-addressed like `deploy/images/build.sh`'s images: the tag is
//! `sandmesh/template-<name>:<12 hex of sha256(normalized spec, base image id)>`, and an
//! existing tag is reused, so the same inputs never build twice.
//!
//! The build machine reaches the package registries through its own configuration: apt's
//! sources are the sandbox image's own (written from this machine's by `build.sh`), pip's
//! index comes from `PIP_INDEX_URL` / `PIP_EXTRA_INDEX_URL` when set (else pip's default), and
//! the CA bundle this machine trusts (`PIP_CERT`, `SSL_CERT_FILE`, or Debian's bundle) is
//! handed to pip and npm for the build only: none of it stays in the image.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use messages::template::ImageSpec;
use sha2::{Digest, Sha256};

use crate::image::ImageError;

/// The repository of a template's images.
pub fn repository(name: &str) -> String {
    format!("sandmesh/template-{name}")
}

/// The image id of `reference`, or `None` when Docker has no such image.
pub fn image_id(reference: &str) -> Result<Option<String>, ImageError> {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", reference])
        .output()
        .map_err(|e| failed("docker image inspect", e))?;
    Ok(out
        .status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
}

fn failed(command: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::Failed {
        command: command.to_string(),
        message: e.to_string(),
    }
}

/// The tag a template's image has when built on `base_id`: the same spec on the same base
/// always names the same image.
pub fn tag(name: &str, spec: &ImageSpec, base_id: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"sandmesh-template\n");
    hash.update(spec.normalized());
    hash.update(b"\nbase ");
    hash.update(base_id.as_bytes());
    let hex = format!("{:x}", hash.finalize());
    format!("{}:{}", repository(name), &hex[..12])
}

/// Where a template's image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The spec adds nothing: the base image itself runs.
    Base(String),
    /// The template's image exists.
    Built(String),
    /// It must be built under this tag.
    Missing(String),
}

/// What `name`'s image is on this Docker (`default_base`: the node's sandbox image, for
/// specs that name no base of their own).
pub fn resolve(name: &str, spec: &ImageSpec, default_base: &str) -> Result<Resolved, ImageError> {
    let base = spec.base.as_deref().unwrap_or(default_base);
    if spec.is_base() {
        return Ok(Resolved::Base(base.to_string()));
    }
    let base_id = image_id(base)?.ok_or_else(|| ImageError::Failed {
        command: format!("building template {name}"),
        message: format!("its base image {base} is not on this Docker host"),
    })?;
    let tag = tag(name, spec, &base_id);
    Ok(match image_id(&tag)? {
        Some(_) => Resolved::Built(tag),
        None => Resolved::Missing(tag),
    })
}

/// Finds or builds `name`'s image and returns its reference. Progress (docker build's
/// output) goes to this process's stderr. Blocking: call it from `spawn_blocking`.
pub fn ensure(name: &str, spec: &ImageSpec, default_base: &str) -> Result<String, ImageError> {
    match resolve(name, spec, default_base)? {
        Resolved::Base(image) | Resolved::Built(image) => Ok(image),
        Resolved::Missing(tag) => {
            let base = spec.base.as_deref().unwrap_or(default_base);
            build(name, spec, base, &tag)?;
            Ok(tag)
        }
    }
}

/// Single-quoted for `sh` (names are validated to registry syntax already; this keeps a
/// mistake in that validation from becoming a shell word).
fn quoted(words: &[String]) -> String {
    let quote = |w: &String| format!("'{}'", w.replace('\'', r"'\''"));
    words.iter().map(quote).collect::<Vec<_>>().join(" ")
}

/// What a template image is built on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildBase {
    /// An image the packages go on as it is (a base of the template's own choosing).
    Image(String),
    /// A sandbox image made by `build.sh`, which names its runtime layer
    /// (`org.sandmesh.runtime`): the packages go on that layer and the supervisor is copied
    /// from `image` last, so a new supervisor rebuilds one small layer while Docker's build
    /// cache keeps the packages (minutes of downloads and installs).
    Runtime {
        runtime: String,
        image: String,
        /// The image's `org.sandmesh.supervisor` label (the executors check it).
        supervisor: String,
    },
}

/// The label `build.sh` puts on an image with a binary: its runtime layer's reference.
const RUNTIME_LABEL: &str = "org.sandmesh.runtime";
/// The label naming the supervisor an image carries (`build.sh`'s `BIN_LABEL`).
const SUPERVISOR_LABEL: &str = "org.sandmesh.supervisor";
/// Where the sandbox image has the supervisor.
const SUPERVISOR_PATH: &str = "/usr/local/bin/sandmesh-supervisor";

impl BuildBase {
    /// How to build on `base`: on its runtime layer when it names one that is on this Docker
    /// host, else on `base` itself.
    pub fn of(base: &str) -> Result<BuildBase, ImageError> {
        let out = Command::new("docker")
            .args([
                "image",
                "inspect",
                "--format",
                "{{json .Config.Labels}}",
                base,
            ])
            .output()
            .map_err(|e| failed("docker image inspect", e))?;
        let labels: std::collections::BTreeMap<String, String> = if out.status.success() {
            serde_json::from_slice(&out.stdout).unwrap_or_default()
        } else {
            Default::default()
        };
        Ok(
            match (labels.get(RUNTIME_LABEL), labels.get(SUPERVISOR_LABEL)) {
                (Some(runtime), Some(supervisor)) if image_id(runtime)?.is_some() => {
                    BuildBase::Runtime {
                        runtime: runtime.clone(),
                        image: base.to_string(),
                        supervisor: supervisor.clone(),
                    }
                }
                _ => BuildBase::Image(base.to_string()),
            },
        )
    }

    fn from(&self) -> &str {
        match self {
            BuildBase::Image(image) => image,
            BuildBase::Runtime { runtime, .. } => runtime,
        }
    }
}

/// The Dockerfile of a template image on `base`.
pub fn dockerfile(name: &str, spec: &ImageSpec, base: &BuildBase, hash: &str) -> String {
    let mut f = format!(
        "FROM {}\n\
         USER 0:0\n\
         ARG DEBIAN_FRONTEND=noninteractive\n\
         COPY ca.crt /tmp/sandmesh-build/ca.crt\n",
        base.from()
    );
    let mut debs = spec.debian_packages.clone();
    if !spec.npm_packages.is_empty() {
        // The sandbox image has Node.js but not npm; it is needed only to install.
        debs.push("npm".into());
    }
    if !debs.is_empty() {
        f += &format!(
            "RUN set -eux; apt-get update; apt-get install -y --no-install-recommends {}; \
             apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/apt/*\n",
            quoted(&debs)
        );
    }
    if !spec.pip_packages.is_empty() {
        // Bookworm's Python is "externally managed"; the image is ours to change.
        f += &format!(
            "ARG PIP_INDEX_URL\nARG PIP_EXTRA_INDEX_URL\nARG PIP_TRUSTED_HOST\n\
             RUN PIP_CERT=/tmp/sandmesh-build/ca.crt PIP_CONFIG_FILE=/dev/null \
             python3 -m pip install --no-cache-dir --break-system-packages \
             --disable-pip-version-check {}\n",
            quoted(&spec.pip_packages)
        );
    }
    if !spec.npm_packages.is_empty() {
        f += &format!(
            "RUN NODE_EXTRA_CA_CERTS=/tmp/sandmesh-build/ca.crt npm install -g --no-fund \
             --no-audit {}; npm cache clean --force\n",
            quoted(&spec.npm_packages)
        );
    }
    // As the sandbox image: no setuid or setgid file survives.
    f += "RUN rm -rf /tmp/sandmesh-build /root/.npm /root/.cache; \
          find / -xdev -perm /6000 -exec chmod a-s {} +\n";
    if let BuildBase::Runtime {
        image, supervisor, ..
    } = base
    {
        f += &format!(
            "COPY --from={image} {SUPERVISOR_PATH} {SUPERVISOR_PATH}\n\
             LABEL {SUPERVISOR_LABEL}={supervisor}\n"
        );
    }
    f += &format!(
        "LABEL org.sandmesh.image=template org.sandmesh.template={name} org.sandmesh.hash={hash}\n\
         USER 10001:10001\n"
    );
    f
}

/// The CA bundle this machine trusts, for pip and npm inside the build.
fn ca_bundle() -> PathBuf {
    ["PIP_CERT", "SSL_CERT_FILE"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/etc/ssl/certs/ca-certificates.crt"))
}

/// Builds `name`'s image on `base` as `tag`. Blocking.
pub fn build(name: &str, spec: &ImageSpec, base: &str, tag: &str) -> Result<(), ImageError> {
    let hash = tag.rsplit(':').next().unwrap_or_default();
    let context = tempdir(name)?;
    let result = (|| {
        std::fs::write(
            context.0.join("Dockerfile"),
            dockerfile(name, spec, &BuildBase::of(base)?, hash),
        )
        .map_err(|e| failed("writing the Dockerfile", e))?;
        // An empty bundle when there is none: the build still works against registries the
        // image's own CAs trust.
        let ca = std::fs::read(ca_bundle()).unwrap_or_default();
        std::fs::write(context.0.join("ca.crt"), ca).map_err(|e| failed("writing ca.crt", e))?;
        let mut cmd = Command::new("docker");
        cmd.env("DOCKER_BUILDKIT", "0")
            .args(["build", "--force-rm", "-t", tag]);
        for var in [
            "PIP_INDEX_URL",
            "PIP_EXTRA_INDEX_URL",
            "PIP_TRUSTED_HOST",
            "http_proxy",
            "https_proxy",
            "no_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "NO_PROXY",
        ] {
            if std::env::var_os(var).is_some() {
                cmd.args(["--build-arg", var]);
            }
        }
        cmd.arg(&context.0);
        progress(&mut cmd, name, tag)
    })();
    drop(context);
    result
}

/// Runs the build with its output on this process's stderr, each line marked with the
/// template's name.
fn progress(cmd: &mut Command, name: &str, tag: &str) -> Result<(), ImageError> {
    use std::io::BufRead as _;
    let command = format!("docker build -t {tag}");
    eprintln!("template {name}: building {tag}");
    let started = std::time::Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(&command, e))?;
    let stderr = child.stderr.take().expect("piped");
    let label = name.to_string();
    // Its stderr is read beside its stdout (either could fill its pipe), and the last lines
    // kept for the error.
    let tail = std::thread::spawn(move || {
        let mut tail = std::collections::VecDeque::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("template {label}: {line}");
            tail.push_back(line);
            if tail.len() > 15 {
                tail.pop_front();
            }
        }
        tail.into_iter().collect::<Vec<_>>().join("\n")
    });
    let stdout = child.stdout.take().expect("piped");
    let mut err = std::io::stderr().lock();
    for line in std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
    {
        let _ = writeln!(err, "template {name}: {line}");
    }
    drop(err);
    let status = child.wait().map_err(|e| failed(&command, e))?;
    let tail = tail.join().unwrap_or_default();
    if !status.success() {
        return Err(ImageError::Failed {
            command,
            message: format!("{status}:\n{tail}"),
        });
    }
    eprintln!(
        "template {name}: built {tag} in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A build context directory, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(name: &str) -> Result<TempDir, ImageError> {
    let dir = std::env::temp_dir().join(format!(
        "sandmesh-template-{name}-{}-{}",
        std::process::id(),
        messages::now_ms()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| failed("creating the build context", e))?;
    Ok(TempDir(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_changes_with_the_spec_and_the_base_only() {
        let spec = ImageSpec {
            debian_packages: vec!["python3-numpy".into()],
            ..Default::default()
        };
        let t = tag("data", &spec, "sha256:aaa");
        assert!(t.starts_with("sandmesh/template-data:"));
        assert_eq!(t.len(), "sandmesh/template-data:".len() + 12);
        assert_eq!(t, tag("data", &spec, "sha256:aaa"));
        assert_ne!(t, tag("data", &spec, "sha256:bbb"));
        assert_ne!(t, tag("data", &ImageSpec::default(), "sha256:aaa"));
    }

    #[test]
    fn the_dockerfile_installs_each_kind_and_ends_unprivileged() {
        let spec = ImageSpec {
            debian_packages: vec!["python3-numpy".into()],
            pip_packages: vec!["tabulate==0.9.0".into()],
            npm_packages: vec!["left-pad".into()],
            base: None,
        };
        let base = BuildBase::Image("sandmesh/sandbox:abc".into());
        let f = dockerfile("x", &spec, &base, "0123");
        assert!(f.starts_with("FROM sandmesh/sandbox:abc\n"));
        assert!(f.contains("apt-get install -y --no-install-recommends 'python3-numpy' 'npm'"));
        assert!(f.contains("--break-system-packages --disable-pip-version-check 'tabulate==0.9.0'"));
        assert!(f.contains("npm install -g --no-fund --no-audit 'left-pad'"));
        assert!(!f.contains("COPY --from"));
        assert!(f.trim_end().ends_with("USER 10001:10001"));
    }

    #[test]
    fn on_a_runtime_layer_the_packages_come_first_and_the_supervisor_last() {
        let spec = ImageSpec {
            debian_packages: vec!["python3-numpy".into()],
            ..Default::default()
        };
        let base = BuildBase::Runtime {
            runtime: "sandmesh/sandbox-runtime:r1".into(),
            image: "sandmesh/sandbox:s1".into(),
            supervisor: "5up".into(),
        };
        let f = dockerfile("x", &spec, &base, "0123");
        assert!(f.starts_with("FROM sandmesh/sandbox-runtime:r1\n"));
        let packages = f.find("apt-get install").unwrap();
        let copy = f
            .find("COPY --from=sandmesh/sandbox:s1 /usr/local/bin/sandmesh-supervisor /usr/local/bin/sandmesh-supervisor\n")
            .unwrap();
        assert!(packages < copy, "{f}");
        assert!(f.contains("LABEL org.sandmesh.supervisor=5up\n"));
        // The one layer that changes with the supervisor comes after every install.
        assert!(f[copy..].find("RUN").is_none(), "{f}");
        assert!(f.trim_end().ends_with("USER 10001:10001"));
    }

    #[test]
    fn a_base_spec_runs_the_base_image() {
        let resolved = resolve(
            "python-default",
            &ImageSpec::default(),
            "sandmesh/sandbox:x",
        );
        assert_eq!(
            resolved.unwrap(),
            Resolved::Base("sandmesh/sandbox:x".into())
        );
    }
}
