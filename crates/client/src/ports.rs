//! Preview ports: expose a port of a session's container, and open byte tunnels to it
//! ([`crate::tunnel`]).

use messages::ports::{ExposedPort, PortExpose, PortList, PortRef, TunnelConnect, TunnelOpened};
use messages::subjects::PortsOp;
use tokio::io::DuplexStream;
use tokio_util::sync::CancellationToken;

use crate::tunnel::{pump, TunnelError};
use crate::{ClientError, MeshClient, Result};

/// Bytes buffered between the caller's end of a tunnel and the pump.
const LOCAL_BUFFER: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct PortsClient {
    mesh: MeshClient,
}

/// An open tunnel: read and write [`Tunnel::stream`] as if it were a connection to the port.
/// Dropping the stream closes the tunnel; [`Tunnel::ended`] says how it ended.
pub struct Tunnel {
    pub stream: DuplexStream,
    pub ended: tokio::task::JoinHandle<std::result::Result<(), TunnelError>>,
    stop: CancellationToken,
}

impl Tunnel {
    /// Ends the tunnel now (both directions), telling the node.
    pub fn close(&self) {
        self.stop.cancel();
    }
}

impl PortsClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// Exposes `port` of `session_id` for `ttl_ms` (default an hour): its URL path and a
    /// token for it.
    pub async fn expose(
        &self,
        session_id: &str,
        port: u16,
        ttl_ms: Option<u64>,
    ) -> Result<ExposedPort> {
        let req = PortExpose {
            session_id: session_id.into(),
            port: port.into(),
            ttl_ms,
        };
        let subject = self.mesh.subjects().ports(PortsOp::Expose);
        self.mesh.request(subject, &req).await
    }

    pub async fn list(&self, session_id: &str) -> Result<Vec<ExposedPort>> {
        let req = PortRef {
            session_id: session_id.into(),
            port: None,
        };
        let subject = self.mesh.subjects().ports(PortsOp::List);
        let reply: PortList = self.mesh.request(subject, &req).await?;
        Ok(reply.ports)
    }

    /// Stops exposing `port`: its token stops working (tunnels open now run on).
    pub async fn unexpose(&self, session_id: &str, port: u16) -> Result<Vec<ExposedPort>> {
        let req = PortRef {
            session_id: session_id.into(),
            port: Some(port.into()),
        };
        let subject = self.mesh.subjects().ports(PortsOp::Unexpose);
        let reply: PortList = self.mesh.request(subject, &req).await?;
        Ok(reply.ports)
    }

    /// Opens a tunnel to `port` of `session_id` (exposed; with the port's `token` when the
    /// caller holds one instead of the tenant's own right to it).
    pub async fn connect(
        &self,
        session_id: &str,
        port: u16,
        token: Option<&str>,
    ) -> Result<Tunnel> {
        let tunnel_id = messages::new_id();
        let subjects = self.mesh.subjects();
        // Subscribed before asking: the node may send as soon as it answers.
        let inbox = self
            .mesh
            .subscribe_live(subjects.tunnel_down_any(&tunnel_id))
            .await?;
        let req = TunnelConnect {
            session_id: session_id.into(),
            port: port.into(),
            tunnel_id: tunnel_id.clone(),
            token: token.map(Into::into),
        };
        let opened: TunnelOpened = self
            .mesh
            .request(subjects.ports(PortsOp::Connect), &req)
            .await?;
        if opened.tunnel_id != tunnel_id || !opened.up.ends_with(&format!(".{tunnel_id}")) {
            let why = format!("the answer names another tunnel ({opened:?})");
            return Err(ClientError::codec(
                "ports.connect",
                std::io::Error::other(why),
            ));
        }
        let (stream, remote) = tokio::io::duplex(LOCAL_BUFFER);
        let stop = CancellationToken::new();
        let nats = self.mesh.nats().clone();
        let ended = tokio::spawn(pump(remote, nats, opened.up, inbox, stop.clone()));
        Ok(Tunnel {
            stream,
            ended,
            stop,
        })
    }
}
