//! Where one of the mesh's HTTP faces (the console, the gateway) listens as `up` configures it:
//! its `SANDMESH_*_ADDR` setting, else its default.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub struct HttpFace {
    /// The setting that moves it, e.g. `SANDMESH_CONSOLE_ADDR`.
    pub var: &'static str,
    pub default: &'static str,
}

impl HttpFace {
    pub fn addr(&self, env: &HashMap<String, String>) -> String {
        env.get(self.var)
            .filter(|a| !a.trim().is_empty())
            .cloned()
            .unwrap_or_else(|| self.default.to_string())
    }

    /// Listens on the address now (`up` runs without this face otherwise, saying why), so no
    /// other program — another mesh starting beside this one — takes it between this check
    /// and the service's start; the service serves on the socket it is handed. `Ok(None)`: the
    /// address is malformed, and the service's configuration reports it with every other bad
    /// setting.
    pub fn listen(
        &self,
        env: &HashMap<String, String>,
    ) -> Result<Option<std::net::TcpListener>, String> {
        let addr = self.addr(env);
        let Ok(parsed) = addr.parse::<SocketAddr>() else {
            return Ok(None);
        };
        let taken = |e: std::io::Error| format!("cannot listen on {addr} ({e}); set {}", self.var);
        let listener = std::net::TcpListener::bind(parsed).map_err(taken)?;
        // tokio takes the socket over as it is: it must not block.
        listener.set_nonblocking(true).map_err(taken)?;
        Ok(Some(listener))
    }

    /// Whether something answers there now.
    pub fn answers(&self, env: &HashMap<String, String>) -> bool {
        self.addr(env)
            .parse::<SocketAddr>()
            .ok()
            .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok())
    }
}
