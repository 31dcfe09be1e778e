//! The listening socket of the services that speak HTTP (the console, the gateway) and what
//! stops them: the kit's own errors, an address that cannot be bound, or the server failing.
//! Their `run` binds the configured address; their `serve` takes a bound listener (tests bind
//! port 0 and read the address first).

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::KitError;

#[derive(Debug, thiserror::Error)]
pub enum HttpServiceError {
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the {service}'s HTTP server failed")]
    Serve {
        service: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Listens on `addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, HttpServiceError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HttpServiceError::Bind { addr, source })
}

/// The address `listener` is bound to (`configured`, or the port the system chose for port 0);
/// an error names the configured one.
pub fn local_addr(
    listener: &TcpListener,
    configured: SocketAddr,
) -> Result<SocketAddr, HttpServiceError> {
    listener
        .local_addr()
        .map_err(|source| HttpServiceError::Bind {
            addr: configured,
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_address_in_use_is_named_in_the_error() {
        let taken = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = local_addr(&taken, "127.0.0.1:0".parse().unwrap()).unwrap();
        assert_ne!(addr.port(), 0, "the system's port is reported");
        let e = bind(addr).await.unwrap_err();
        assert!(
            matches!(e, HttpServiceError::Bind { addr: a, .. } if a == addr),
            "{e:?}"
        );
        assert_eq!(e.to_string(), format!("cannot listen on {addr}"));
    }
}
