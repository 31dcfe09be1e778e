//! `executor.docker.<node>.tunnel`: the scheduler's order to open a preview port's tunnel into
//! one of this node's session containers. The node dials the port through the container's
//! [`crate::ports::PortDoor`], subscribes to the tunnel's up subject, answers, and pumps bytes
//! (`sandmesh_client::tunnel::pump`) until the tunnel ends or the container goes.

use std::sync::Arc;

use executor_node::NodeState;
use kit::{KitError, Runtime};
use messages::ports::{validate_tunnel_id, ExecutorTunnel, TunnelOpened};
use messages::ErrorBody;
use sandmesh_client::tunnel::pump;

use crate::ports::{Doors, PortsError};

impl From<PortsError> for ErrorBody {
    fn from(e: PortsError) -> Self {
        match e {
            PortsError::Directory { .. } => ErrorBody::internal(kit::error_chain(&e)),
            PortsError::Gone => ErrorBody::not_found(e.to_string()),
            PortsError::NoSupervisor | PortsError::Refused { .. } | PortsError::NoAnswer { .. } => {
                ErrorBody::unavailable(e.to_string())
            }
        }
    }
}

/// Serves the node's tunnel subject.
pub async fn serve(
    runtime: &Runtime,
    node_id: &str,
    doors: Doors,
    node: Arc<NodeState>,
) -> Result<(), KitError> {
    let subjects = runtime.subjects().clone();
    let nats = runtime.client.clone();
    let subject = subjects.executor_tunnel(node_id);
    let handler = kit::handler(move |_ctx, order: ExecutorTunnel| {
        let (doors, node, subjects, nats) =
            (doors.clone(), node.clone(), subjects.clone(), nats.clone());
        async move {
            validate_tunnel_id(&order.tunnel_id)?;
            let door = doors.get(&order.session_id).ok_or_else(|| {
                ErrorBody::not_found(format!(
                    "session {} has no container on this node",
                    order.session_id
                ))
            })?;
            let conn = door.dial(order.port).await?;
            let tenant = order.tenant.as_ref();
            let up = subjects.tunnel_up(tenant, &order.tunnel_id);
            let inbox = nats
                .subscribe(up.clone())
                .await
                .map_err(|e| ErrorBody::unavailable(format!("subscribing to the tunnel: {e}")))?;
            let down = subjects.tunnel_down(tenant, &order.tunnel_id);
            let (stop, open) = door.tunnel_guard();
            let (session, port) = (order.session_id.clone(), order.port);
            node.tasks.spawn(async move {
                let _open = open;
                if let Err(e) = pump(conn, nats, down, inbox, stop).await {
                    tracing::debug!(session, port, error = %e, "tunnel ended");
                }
            });
            Ok(TunnelOpened {
                tunnel_id: order.tunnel_id,
                up,
            })
        }
    });
    runtime.serve(subject, handler).await
}
