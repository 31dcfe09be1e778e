//! `sandmesh mcp`: the mesh as Model Context Protocol tools for an agent (`sandmesh-mcp`).
//! It acts as the tenant's agent, with the credentials every agent command uses
//! (`SANDMESH_CREDS`, a `SANDMESH_NATS_URL` carrying them, or those `up` wrote).
//!
//! Over stdio (the default) stdout carries MCP frames only; logs go to stderr, which MCP
//! clients keep as the server's log.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context;
use sandmesh_client::MeshClient;

use crate::creds::Acting;

#[derive(clap::Args, Debug)]
pub struct McpArgs {
    /// Serve Streamable HTTP on this address (`PORT` alone means 127.0.0.1:PORT) at `/mcp`,
    /// instead of speaking MCP on stdin/stdout.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub listen: Option<SocketAddr>,
}

/// `8080` → 127.0.0.1:8080: loopback unless an address is named, since anyone who reaches
/// the port acts with the tenant's credentials.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is neither PORT nor IP:PORT (e.g. 8080 or 127.0.0.1:8080)"))
}

pub async fn run(args: McpArgs) -> anyhow::Result<i32> {
    let (config, nats) = crate::client_config(Acting::Agent).await?;
    let _telemetry = kit::telemetry::init(
        "sandmesh-mcp",
        config.otlp_endpoint.as_deref(),
        config.log_json,
    );
    // An execution's own wait is set per call; this bounds the quick ones (files, look-ups).
    let mesh = MeshClient::new(nats, config.subjects)
        .with_timeout(Duration::from_secs(60))
        .with_headers(kit::telemetry::inject_current);
    let shutdown = kit::shutdown::on_signals();
    match args.listen {
        None => sandmesh_mcp::serve_stdio(mesh, shutdown).await?,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            eprintln!(
                "sandmesh: MCP over Streamable HTTP at http://{}{}",
                listener.local_addr()?,
                sandmesh_mcp::HTTP_PATH
            );
            sandmesh_mcp::serve_http(mesh, listener, shutdown).await?;
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_listens_on_loopback_only() {
        assert_eq!(
            parse_listen("8080").unwrap(),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert_eq!(
            parse_listen("0.0.0.0:9000").unwrap(),
            "0.0.0.0:9000".parse().unwrap()
        );
        assert!(parse_listen("localhost").is_err());
    }
}
