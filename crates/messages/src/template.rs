//! Templates: the environment code runs in, as
//! data. A template names the packages installed into its image at build time (so a sandbox
//! never needs the network to import them) and the defaults its executions get. Stored in KV
//! `sandbox_templates`, served on `sandbox.v1.templates.{create,get,list,update,delete}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::code::{FileSpec, Limits};
use crate::filesystem::FilesystemPolicy;
use crate::network::NetworkPolicy;
use crate::validate::{validate_env_name, validate_relative_path, ValidationError};

/// The template every execution without one runs in: the sandbox image, nothing added.
pub const DEFAULT_TEMPLATE: &str = "python-default";
/// Longest template name (it becomes a Docker repository name and a KV key).
pub const MAX_NAME_LEN: usize = 63;
/// Most packages of one kind a template may list.
pub const MAX_PACKAGES: usize = 256;
/// Most bootstrap files, and their total size.
pub const MAX_FILES: usize = 64;
pub const MAX_FILES_BYTES: usize = 256 * 1024;
/// Largest warm pool a template may ask for on each executor node.
pub const MAX_WARM_POOL: u32 = 32;

/// A template as operators write it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// `[a-z0-9-]`, starting with a letter, at most [`MAX_NAME_LEN`].
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The image it builds on; absent: the executor's sandbox image. Another base must carry
    /// what the sandbox image does (the supervisor, the `sandbox` user): one built from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Debian packages (`name` or `name=version`), installed with apt at build time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub debian_packages: Vec<String>,
    /// PyPI requirements (`name`, `name==1.2`, `name>=1,<2`, extras allowed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip_packages: Vec<String>,
    /// npm packages (`name`, `@scope/name`, `name@version`), installed globally.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub npm_packages: Vec<String>,
    /// Environment of every execution; a request's own `env` wins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Limits an execution gets for what it does not ask itself (the ceilings still apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Egress when the request names none; clamped by the operator's ceiling like any policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// Files placed in the workspace of each execution (a request's file of the same path
    /// wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileSpec>,
    /// Warm containers each executor node keeps for it once it is in use; absent: the
    /// node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool: Option<u32>,
    /// Directories hidden, writable or read-only in its sandboxes (`crate::filesystem`),
    /// enforced by mounts; a session's policy adds to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemPolicy>,
}

/// What a template's image is made of: the inputs of its content hash. Nothing else about a
/// template (env, limits, files) changes the image, so editing those never rebuilds it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// Absent: the executor's sandbox image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub debian_packages: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip_packages: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub npm_packages: Vec<String>,
}

impl ImageSpec {
    /// Nothing added to the base: the base image itself runs, no build needed.
    pub fn is_base(&self) -> bool {
        self.debian_packages.is_empty()
            && self.pip_packages.is_empty()
            && self.npm_packages.is_empty()
    }

    /// The canonical bytes hashed into the image tag: package lists sorted and deduplicated,
    /// so the order an operator wrote them in does not make a new image.
    pub fn normalized(&self) -> Vec<u8> {
        let sorted = |v: &[String]| {
            let mut v: Vec<String> = v.iter().map(|p| p.trim().to_string()).collect();
            v.sort();
            v.dedup();
            v
        };
        let canonical = ImageSpec {
            base: self.base.clone(),
            debian_packages: sorted(&self.debian_packages),
            pip_packages: sorted(&self.pip_packages),
            npm_packages: sorted(&self.npm_packages),
        };
        serde_json::to_vec(&canonical).expect("an ImageSpec serialises to JSON")
    }
}

impl Template {
    pub fn image_spec(&self) -> ImageSpec {
        ImageSpec {
            base: self.base.clone(),
            debian_packages: self.debian_packages.clone(),
            pip_packages: self.pip_packages.clone(),
            npm_packages: self.npm_packages.clone(),
        }
    }

    /// Every field checked, so a bad template is refused when written, never when built.
    /// Package names are restricted to their registries' own syntax: they end up as arguments
    /// of apt, pip and npm in a build, where an option (`-…`) or a shell word must never pass.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_name(&self.name)?;
        if self.description.len() > 1024 {
            return Err(ValidationError::invalid(
                "description",
                "is longer than 1024 bytes",
            ));
        }
        if let Some(base) = &self.base {
            let ok = !base.is_empty()
                && base.len() <= 255
                && !base.starts_with('-')
                && base
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c));
            if !ok {
                return Err(ValidationError::invalid(
                    "base",
                    format!("{base:?} is not an image reference"),
                ));
            }
        }
        packages("debian_packages", &self.debian_packages, is_debian_package)?;
        packages("pip_packages", &self.pip_packages, is_pip_requirement)?;
        packages("npm_packages", &self.npm_packages, is_npm_package)?;
        for name in self.env.keys() {
            validate_env_name(name)?;
        }
        if let Some(network) = &self.network {
            network.validate()?;
        }
        if let Some(filesystem) = &self.filesystem {
            filesystem.validate()?;
        }
        if self.files.len() > MAX_FILES {
            return Err(ValidationError::invalid(
                "files",
                format!("at most {MAX_FILES} bootstrap files"),
            ));
        }
        let mut total = 0;
        for (i, file) in self.files.iter().enumerate() {
            let field = format!("files[{i}].path");
            validate_relative_path(&field, &file.path)?;
            total += file
                .bytes()
                .map_err(|e| ValidationError::invalid(format!("files[{i}].content"), e))?
                .len();
        }
        if total > MAX_FILES_BYTES {
            return Err(ValidationError::TooLarge {
                field: "files".into(),
                size: total,
                limit: MAX_FILES_BYTES,
            });
        }
        if self.warm_pool.is_some_and(|n| n > MAX_WARM_POOL) {
            return Err(ValidationError::invalid(
                "warm_pool",
                format!("at most {MAX_WARM_POOL}"),
            ));
        }
        Ok(())
    }
}

/// A template name: `[a-z][a-z0-9-]*`, at most [`MAX_NAME_LEN`] (a Docker repository name
/// component and a KV key).
pub fn validate_name(name: &str) -> Result<(), ValidationError> {
    let ok = name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ValidationError::invalid(
            "name",
            format!("{name:?}: use [a-z][a-z0-9-]*, at most {MAX_NAME_LEN} characters"),
        ))
    }
}

fn packages(field: &str, list: &[String], valid: fn(&str) -> bool) -> Result<(), ValidationError> {
    if list.len() > MAX_PACKAGES {
        return Err(ValidationError::invalid(
            field,
            format!("at most {MAX_PACKAGES} packages"),
        ));
    }
    match list.iter().find(|p| p.len() > 214 || !valid(p)) {
        Some(bad) => Err(ValidationError::invalid(
            field,
            format!("{bad:?} is not a package name this registry accepts"),
        )),
        None => Ok(()),
    }
}

/// Debian policy §5.6.1/§5.6.12: `[a-z0-9][a-z0-9+.-]+`, optionally `=version`.
fn is_debian_package(p: &str) -> bool {
    let (name, version) = match p.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (p, None),
    };
    let name_ok = name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+.-".contains(c));
    let version_ok = version.is_none_or(|v| {
        v.starts_with(|c: char| c.is_ascii_digit())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".+~:-".contains(c))
    });
    name_ok && version_ok
}

/// PEP 508 names with extras and version specifiers, no URLs or markers.
fn is_pip_requirement(p: &str) -> bool {
    let name_end = p
        .find(|c: char| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
        .unwrap_or(p.len());
    let (name, rest) = p.split_at(name_end);
    name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-[],=<>!~*".contains(c))
}

/// npm names (`[@scope/]name`, lower case) with an optional `@version` or range.
fn is_npm_package(p: &str) -> bool {
    let (scope, rest) = match p.strip_prefix('@') {
        Some(scoped) => match scoped.split_once('/') {
            Some((scope, rest)) => (Some(scope), rest),
            None => return false,
        },
        None => (None, p),
    };
    let (name, version) = match rest.split_once('@') {
        Some((n, v)) => (n, Some(v)),
        None => (rest, None),
    };
    let token = |s: &str| {
        !s.is_empty()
            && !s.starts_with(['.', '_', '-'])
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-~".contains(c))
    };
    scope.is_none_or(token)
        && token(name)
        && version.is_none_or(|v| {
            !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-+^~<>=*".contains(c))
        })
}

/// The value stored in KV `sandbox_templates` under the template's name.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TemplateRecord {
    pub template: Template,
    /// Put in the bucket by the service itself (re-created at start when deleted).
    #[serde(default)]
    pub builtin: bool,
    /// Unix milliseconds.
    pub created_at: u64,
    pub updated_at: u64,
}

/// `templates.get` and `templates.delete`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateRef {
    pub name: String,
}

/// `templates.list`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateList {}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TemplateListReply {
    pub templates: Vec<TemplateRecord>,
}

/// What an executor needs of a template to run in it (`ExecutorRun::template`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunTemplate {
    pub name: String,
    pub image: ImageSpec,
    /// Warm containers the node keeps for it; absent: the node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool: Option<u32>,
}

/// Which template ran (in `ExecResult::template`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TemplateRan {
    pub name: String,
    /// The image it ran in (`sandmesh/template-<name>:<hash>`, or the sandbox image for a
    /// template that adds nothing).
    pub image: String,
}

/// The templates every mesh has (put in the bucket at start when absent).
pub fn builtins() -> Vec<Template> {
    let debian = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    vec![
        Template {
            name: DEFAULT_TEMPLATE.into(),
            description: "the sandbox image: Python 3 and Node.js with their standard libraries"
                .into(),
            ..Default::default()
        },
        Template {
            name: "python-data".into(),
            description: "Python 3 with numpy, pandas, matplotlib, scipy and pytest".into(),
            debian_packages: debian(&[
                "python3-numpy",
                "python3-pandas",
                "python3-matplotlib",
                "python3-scipy",
                "python3-pytest",
            ]),
            // matplotlib must not try to open a display.
            env: BTreeMap::from([("MPLBACKEND".to_string(), "Agg".to_string())]),
            ..Default::default()
        },
        Template {
            name: "node-default".into(),
            description: "the sandbox image, for JavaScript (Node.js)".into(),
            ..Default::default()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_valid() {
        for t in builtins() {
            t.validate().unwrap();
        }
    }

    #[test]
    fn names_and_packages_are_checked() {
        for bad in ["", "Python", "1abc", "a_b", "a.b", &"a".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(is_debian_package("python3-numpy"));
        assert!(is_debian_package("g++=4:12.2.0-3"));
        assert!(!is_debian_package("-o=APT::Foo"));
        assert!(!is_debian_package("numpy; rm -rf /"));
        assert!(is_pip_requirement("tabulate==0.9.0"));
        assert!(is_pip_requirement("requests[socks]>=2,<3"));
        assert!(!is_pip_requirement("--index-url=http://evil.example.org"));
        assert!(!is_pip_requirement("pkg @ https://example.org/x.whl"));
        assert!(is_npm_package("@types/node@20.1.0"));
        assert!(is_npm_package("left-pad"));
        assert!(!is_npm_package("--registry=http://example.org"));
        assert!(!is_npm_package("a$(id)"));
    }

    #[test]
    fn the_image_hash_input_ignores_order_and_duplicates() {
        let a = ImageSpec {
            debian_packages: vec!["b".into(), "a".into(), "a".into()],
            ..Default::default()
        };
        let b = ImageSpec {
            debian_packages: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        assert_eq!(a.normalized(), b.normalized());
        assert_ne!(a.normalized(), ImageSpec::default().normalized());
    }
}
