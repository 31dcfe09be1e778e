//! `sandmesh template`: list, show, add and remove templates (operators and the admin
//! write), and build one's image on this machine's Docker ahead of its first use.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use messages::template::{Template, TemplateRecord};
use sandmesh_client::{ClientError, MeshClient};

#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum TemplateCommand {
    /// Every template, with what it adds to the sandbox image.
    List {
        /// Print raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// One template, as JSON.
    Get { name: String },
    /// Add a template from a JSON file (`-`: standard input); `--replace` updates one.
    Create {
        file: PathBuf,
        #[arg(long)]
        replace: bool,
    },
    /// Remove a template.
    Delete { name: String },
    /// Build the template's image on this machine's Docker (nothing to do when an image of
    /// the same inputs exists); prints the image reference.
    Build {
        name: String,
        /// The sandbox image to build on (default: the one `up` uses, built when missing).
        #[arg(long, env = "SANDMESH_EXEC_IMAGE")]
        image: Option<String>,
        /// Build a built-in template from its definition in this program, with no mesh
        /// running (ahead of a first `up`, in an image pipeline or CI); a mesh's copy of a
        /// built-in may have been changed, and without this flag the mesh's copy is built.
        #[arg(long)]
        builtin: bool,
    },
}

pub async fn run(mesh: &MeshClient, cmd: TemplateCommand) -> anyhow::Result<i32> {
    let templates = mesh.templates();
    let mut out = crate::out::stdout();
    match cmd {
        TemplateCommand::List { json } => {
            let list = match templates.list().await {
                Ok(list) => list,
                Err(e) => return refused(e),
            };
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
            }
            for r in list.iter().filter(|_| !json) {
                writeln!(out, "{}", line(r))?;
            }
        }
        TemplateCommand::Get { name } => match templates.get(&name).await {
            Ok(r) => writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?,
            Err(e) => return refused(e),
        },
        TemplateCommand::Create { file, replace } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?
            };
            let template: Template = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a template (JSON)", file.display()))?;
            let done = if replace {
                templates.update(&template).await
            } else {
                templates.create(&template).await
            };
            match done {
                Ok(r) => writeln!(out, "{}", line(&r))?,
                Err(e) => return refused(e),
            }
        }
        TemplateCommand::Delete { name } => match templates.delete(&name).await {
            Ok(r) => writeln!(out, "deleted {}", r.template.name)?,
            Err(e) => return refused(e),
        },
        TemplateCommand::Build { name, image, .. } => {
            let record = match templates.get(&name).await {
                Ok(r) => r,
                Err(e) => return refused(e),
            };
            writeln!(out, "{}", build(record.template, image).await?)?;
        }
    }
    Ok(0)
}

/// `sandmesh template build NAME --builtin`: the built-in template's image, no mesh needed.
pub async fn build_builtin(name: &str, image: Option<String>) -> anyhow::Result<i32> {
    let Some(template) = messages::template::builtins()
        .into_iter()
        .find(|t| t.name == name)
    else {
        let names: Vec<String> = messages::template::builtins()
            .into_iter()
            .map(|t| t.name)
            .collect();
        eprintln!(
            "sandmesh template: {name} is not a built-in template (built-in: {})",
            names.join(", ")
        );
        return Ok(1);
    };
    outln!("{}", build(template, image).await?);
    Ok(0)
}

/// Builds `template`'s image on `image` (default: the sandbox image `up` uses, built when
/// missing); returns its reference.
async fn build(template: Template, image: Option<String>) -> anyhow::Result<String> {
    let base = match image {
        Some(image) => image,
        None => docker_executor::image::ensure()
            .await
            .context("building the sandbox image")?,
    };
    let spec = template.image_spec();
    let name = template.name;
    Ok(
        tokio::task::spawn_blocking(move || containers::template::ensure(&name, &spec, &base))
            .await??,
    )
}

/// `name  description  [+ N debian, N pip, N npm]`.
fn line(r: &TemplateRecord) -> String {
    let t = &r.template;
    let mut adds = Vec::new();
    for (n, kind) in [
        (t.debian_packages.len(), "debian"),
        (t.pip_packages.len(), "pip"),
        (t.npm_packages.len(), "npm"),
    ] {
        if n > 0 {
            adds.push(format!("{n} {kind}"));
        }
    }
    let adds = if adds.is_empty() {
        "the sandbox image".to_string()
    } else {
        format!("+ {}", adds.join(", "))
    };
    let builtin = if r.builtin { " (built-in)" } else { "" };
    format!("{:<20} {adds:<28} {}{builtin}", t.name, t.description)
}

fn refused(e: ClientError) -> anyhow::Result<i32> {
    match e {
        ClientError::Service { body, .. } => {
            eprintln!("sandmesh template: {}", body.message);
            Ok(1)
        }
        other => Err(other.into()),
    }
}
