//! `sandmesh ws ls|get|put|rm`: session workspaces from the command line, through the
//! workspace-store (files of any size: large ones travel through the object store).

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use sandmesh_client::{ClientError, MeshClient};

#[derive(Debug, clap::Subcommand)]
pub enum WsCommand {
    /// List a workspace (or one directory of it).
    Ls {
        session: String,
        /// Directory to list (default: the workspace root).
        prefix: Option<String>,
        /// Everything below, not just direct children.
        #[arg(short, long)]
        recursive: bool,
        /// Print the entries as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a file to stdout, or save it with --out.
    Get {
        session: String,
        path: String,
        #[arg(short, long)]
        out: Option<PathBuf>,
    },
    /// Write a file from --file, from CONTENT, or from stdin when neither is given.
    Put {
        session: String,
        path: String,
        /// Inline content.
        #[arg(conflicts_with = "file")]
        content: Option<String>,
        #[arg(short, long)]
        file: Option<PathBuf>,
    },
    /// Remove a file, or a directory with --recursive.
    Rm {
        session: String,
        path: String,
        #[arg(short, long)]
        recursive: bool,
    },
}

/// Runs one `ws` command; returns the process exit code (0 ok, 1 refused by the store).
pub async fn run(mesh: &MeshClient, cmd: WsCommand) -> anyhow::Result<i32> {
    let ws = mesh.workspace();
    let outcome = match cmd {
        WsCommand::Ls {
            session,
            prefix,
            recursive,
            json,
        } => ws
            .list(&session, prefix.as_deref(), recursive)
            .await
            .map(|listing| {
                if json {
                    outln!(
                        "{}",
                        serde_json::to_string_pretty(&listing.entries).unwrap_or_default()
                    );
                } else {
                    for e in listing.entries {
                        let (kind, size) = if e.is_dir {
                            ("dir ", "-".to_string())
                        } else {
                            ("file", e.size.to_string())
                        };
                        let slash = if e.is_dir { "/" } else { "" };
                        outln!("{kind} {size:>12}  {}{slash}", e.path);
                    }
                }
            }),
        WsCommand::Get { session, path, out } => match ws.read(&session, &path).await {
            Ok(bytes) => {
                match out {
                    Some(file) => std::fs::write(&file, &bytes)
                        .with_context(|| format!("writing {}", file.display()))?,
                    None => crate::out::stdout().write_all(&bytes)?,
                }
                Ok(())
            }
            Err(e) => Err(e),
        },
        WsCommand::Put {
            session,
            path,
            content,
            file,
        } => {
            let bytes = match (content, file) {
                (Some(text), _) => text.into_bytes(),
                (None, Some(file)) => {
                    std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?
                }
                (None, None) => {
                    let mut buf = Vec::new();
                    std::io::stdin().read_to_end(&mut buf)?;
                    buf
                }
            };
            ws.write(&session, &path, &bytes)
                .await
                .map(|e| eprintln!("wrote {} ({} bytes)", e.path, e.size))
        }
        WsCommand::Rm {
            session,
            path,
            recursive,
        } => ws
            .delete(&session, &path, recursive)
            .await
            .map(|_| eprintln!("removed {path}")),
    };
    Ok(report(outcome))
}

fn report(outcome: Result<(), ClientError>) -> i32 {
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {:#}", anyhow::Error::from(e));
            1
        }
    }
}
