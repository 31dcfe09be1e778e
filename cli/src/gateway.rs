//! `sandmesh gateway`: where the HTTP API is and how to call it. `sandmesh up` starts the
//! gateway; `sandmesh serve gateway` (or the `sandmesh-gateway` binary) runs it on its own.

use std::collections::HashMap;

use crate::face::HttpFace;

pub const FACE: HttpFace = HttpFace {
    var: "SANDMESH_GATEWAY_ADDR",
    default: gateway::config::DEFAULT_ADDR,
};

/// The E2B facade: the gateway's second listener, for E2B's own SDKs.
pub const E2B_FACE: HttpFace = HttpFace {
    var: "SANDMESH_E2B_ADDR",
    default: "127.0.0.1:4282",
};

/// The API's base URL for these settings.
pub fn url(env: &HashMap<String, String>) -> String {
    format!("http://{}/api/v1", FACE.addr(env))
}

pub fn run() -> anyhow::Result<i32> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let url = url(&env);
    outln!("The HTTP API: {url} (OpenAPI document: {url}/openapi.json)");
    if !FACE.answers(&env) {
        outln!("  (nothing answers there now: `sandmesh up` starts it)");
    }
    outln!("A key for a tenant (shown once):  sandmesh tenant key create default");
    outln!("Then:");
    outln!(
        "  curl -s -H \"Authorization: Bearer $KEY\" -H 'Content-Type: application/json' \\\n    \
         -d '{{\"language\":\"python\",\"code\":\"print(1)\"}}' {url}/execute"
    );
    Ok(0)
}
