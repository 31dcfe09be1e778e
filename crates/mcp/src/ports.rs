//! The preview port tool: make a port a session's server listens on reachable through the
//! HTTP gateway (`ports.expose`).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router, ErrorData};

use crate::params::ExposePort;
use crate::render;
use crate::tools::MeshTools;

#[tool_router(router = port_tools, vis = "pub(crate)")]
impl MeshTools {
    #[tool(
        description = "Make a TCP port a server in the session listens on (say a web app on \
        8000, started in the session) reachable through the sandmesh HTTP gateway. Answers \
        with its path on the gateway and a token that opens it in a browser, valid for ttl_ms \
        (an hour by default).",
        annotations(title = "Expose a port", open_world_hint = false)
    )]
    async fn expose_port(
        &self,
        Parameters(p): Parameters<ExposePort>,
    ) -> Result<CallToolResult, ErrorData> {
        let port = match messages::ports::validate_port(p.port) {
            Ok(port) => port,
            Err(e) => return Ok(render::error("bad_request", &e.to_string())),
        };
        let exposed = self
            .mesh
            .ports()
            .expose(&p.session_id, port, p.ttl_ms)
            .await;
        Ok(match exposed {
            Ok(e) => {
                let token = e.token.unwrap_or_default();
                let param = messages::ports::TOKEN_PARAM;
                CallToolResult::success(vec![ContentBlock::text(format!(
                    "port {port} of session {} is exposed until {} (unix ms): open \
                     <gateway>{}?{param}={token} in a browser (the gateway is the sandmesh \
                     HTTP API's address, http://127.0.0.1:4281 by default), or send an API \
                     key as `Authorization: Bearer`.",
                    e.session_id, e.expires_at, e.url
                ))])
            }
            Err(e) => render::client_error(&e),
        })
    }
}
