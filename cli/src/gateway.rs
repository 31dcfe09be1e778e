//! `sandmesh gateway`: where the HTTP API is and how to call it. `sandmesh up` starts the
//! gateway; `sandmesh serve gateway` (or the `sandmesh-gateway` binary) runs it on its own.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The gateway's address as `up` configures it (`SANDMESH_GATEWAY_ADDR`, else the default).
fn addr(env: &HashMap<String, String>) -> String {
    env.get("SANDMESH_GATEWAY_ADDR")
        .filter(|a| !a.trim().is_empty())
        .cloned()
        .unwrap_or_else(|| gateway::config::DEFAULT_ADDR.to_string())
}

/// The API's base URL for these settings.
pub fn url(env: &HashMap<String, String>) -> String {
    format!("http://{}/api/v1", addr(env))
}

/// Whether the gateway's address can be listened on now (`up` runs without it otherwise,
/// saying why). A malformed address passes: the gateway's configuration reports it.
pub fn can_listen(env: &HashMap<String, String>) -> Result<(), String> {
    let addr = addr(env);
    let Ok(parsed) = addr.parse::<SocketAddr>() else {
        return Ok(());
    };
    std::net::TcpListener::bind(parsed)
        .map(drop)
        .map_err(|e| format!("cannot listen on {addr} ({e}); set SANDMESH_GATEWAY_ADDR"))
}

pub fn run() -> anyhow::Result<i32> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let url = url(&env);
    println!("The HTTP API: {url} (OpenAPI document: {url}/openapi.json)");
    let running = addr(&env)
        .parse::<SocketAddr>()
        .ok()
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok());
    if !running {
        println!("  (nothing answers there now: `sandmesh up` starts it)");
    }
    println!("A key for a tenant (shown once):  sandmesh tenant key create default");
    println!("Then:");
    println!(
        "  curl -s -H \"Authorization: Bearer $KEY\" -H 'Content-Type: application/json' \\\n    \
         -d '{{\"language\":\"python\",\"code\":\"print(1)\"}}' {url}/execute"
    );
    Ok(0)
}
