//! Name resolution by the proxy itself, so the address it checks is the address it dials.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;

use futures::future::BoxFuture;

/// Resolves a host name to its addresses. The proxy checks every answer before dialing, so a
/// resolver is trusted for *which* public address a name has, never for reaching internal ones.
pub trait Resolver: Send + Sync + 'static {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// The host's resolver (`getaddrinfo` through tokio's `lookup_host`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host, 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// A fixed name → addresses table: for tests and for deployments that pin names.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    table: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `host` (matched case-insensitively) resolving to `addrs`.
    pub fn with(mut self, host: &str, addrs: &[IpAddr]) -> Self {
        self.table
            .insert(messages::network::normalize_host(host), addrs.to_vec());
        self
    }
}

impl Resolver for StaticResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        let found = self
            .table
            .get(&messages::network::normalize_host(host))
            .cloned();
        Box::pin(async move {
            found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
        })
    }
}
