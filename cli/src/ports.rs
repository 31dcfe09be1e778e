//! `sandmesh ports`: expose a port a session's server listens on, list and unexpose them. The
//! URL printed carries the port's token, so it opens in a browser as it is.

use std::collections::HashMap;
use std::time::Duration;

use sandmesh_client::MeshClient;

#[derive(clap::Subcommand, Debug, Clone)]
pub enum PortsCommand {
    /// Make a port of a session's container reachable through the HTTP gateway.
    Expose {
        session_id: String,
        port: u16,
        /// How long it stays exposed: `90s`, `10m`, `2h` (default an hour, at most a day).
        #[arg(long, value_parser = crate::sessions::parse_duration)]
        ttl: Option<Duration>,
    },
    /// The session's exposed ports.
    List { session_id: String },
    /// Stop exposing a port (its token stops working).
    Unexpose { session_id: String, port: u16 },
}

pub async fn run(mesh: &MeshClient, cmd: PortsCommand) -> anyhow::Result<i32> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let base = format!("http://{}", crate::gateway::FACE.addr(&env));
    let ports = mesh.ports();
    match cmd {
        PortsCommand::Expose {
            session_id,
            port,
            ttl,
        } => {
            let ttl_ms = ttl.map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64);
            let exposed = ports.expose(&session_id, port, ttl_ms).await?;
            let token = exposed.token.unwrap_or_default();
            outln!(
                "{base}{}?{}={token}",
                exposed.url,
                messages::ports::TOKEN_PARAM
            );
            outln!(
                "  (or http://{port}-{session_id}.localhost:{} with the same token)",
                base.rsplit(':').next().unwrap_or("")
            );
            outln!(
                "  with a key: curl -H \"Authorization: Bearer $KEY\" {base}{}",
                exposed.url
            );
        }
        PortsCommand::List { session_id } => {
            for p in ports.list(&session_id).await? {
                outln!("{}\t{base}{}\texpires_at={}", p.port, p.url, p.expires_at);
            }
        }
        PortsCommand::Unexpose { session_id, port } => {
            ports.unexpose(&session_id, port).await?;
            outln!("port {port} of session {session_id} is no longer exposed");
        }
    }
    Ok(0)
}
