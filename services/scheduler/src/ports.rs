//! `PortsApi`: the `ports.{expose,list,unexpose,connect}` endpoints. Which ports of a session
//! are exposed lives in its record (`SessionRecord::ports`: each port's token hash and expiry);
//! `connect` checks the caller against it and orders the node holding the session's container
//! to open the tunnel (`executor.docker.<node>.tunnel`).
//!
//! A port's token is 256 random bits behind the tenant's name ([`messages::ports::make_token`]);
//! only its SHA-256 is stored, so `list` cannot hand it out again, and exposing the port anew
//! replaces it.

use kit::RequestContext;
use messages::exec::Tier;
use messages::ports::{
    make_token, port_path, ExecutorTunnel, ExposedPort, Exposure, PortExpose, PortList, PortRef,
    TunnelConnect, TunnelOpened, MAX_EXPOSED_PORTS,
};
use messages::session::{SessionRecord, SessionState};
use messages::{ErrorBody, ServiceName};
use ring::rand::SecureRandom;
use sha2::{Digest, Sha256};

use crate::error::{PortError, SchedulerError, SessionEnd};
use crate::executor_runner::ExecutorRunner;
use crate::sessions::{Change, SessionTable};

#[derive(Clone)]
pub struct PortsApi {
    table: SessionTable,
    executor: ExecutorRunner,
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl PortsApi {
    pub fn new(table: SessionTable, executor: ExecutorRunner) -> Self {
        Self { table, executor }
    }

    /// The caller's session `named` (scoped as `id`), open, of a tier that keeps a container.
    async fn session(&self, id: &str, named: &str) -> Result<SessionRecord, SchedulerError> {
        let record = self
            .table
            .get(id)
            .await?
            .ok_or_else(|| SchedulerError::NoSession { id: named.into() })?;
        if record.state == SessionState::Closed {
            return Err(SchedulerError::SessionEnded {
                id: named.into(),
                why: SessionEnd::Closed,
            });
        }
        if record.tier != Tier::Session {
            let tier = record.tier;
            return Err(PortError::NoResidentSandbox {
                id: named.into(),
                tier,
            }
            .into());
        }
        Ok(record)
    }

    /// `ports.expose`: a new token for the port, valid for its TTL.
    pub async fn expose(
        &self,
        ctx: RequestContext,
        req: PortExpose,
    ) -> Result<ExposedPort, SchedulerError> {
        let (port, ttl) = req.admit()?;
        let id = ctx.caller.scope("session_id", &req.session_id)?;
        self.session(&id, &req.session_id).await?;
        let mut secret = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut secret)
            .map_err(|_| SchedulerError::Refused(ErrorBody::internal("no randomness")))?;
        let token = make_token(ctx.caller.tenant(), &secret);
        let now = messages::now_ms();
        let exposure = Exposure {
            token_sha256: sha256_hex(&token),
            expires_at: now.saturating_add(ttl),
        };
        let mut full = false;
        let stored = self
            .table
            .update(&id, |r| {
                r.ports.retain(|_, e| e.expires_at > now);
                full = !r.ports.contains_key(&port) && r.ports.len() >= MAX_EXPOSED_PORTS;
                if full {
                    return Change::Keep;
                }
                r.ports.insert(port, exposure.clone());
                Change::Write
            })
            .await?;
        if stored.is_none() {
            return Err(SchedulerError::SessionVanished { id: req.session_id });
        }
        if full {
            return Err(PortError::TooMany { id: req.session_id }.into());
        }
        Ok(ExposedPort {
            url: port_path(&req.session_id, port),
            session_id: req.session_id,
            port,
            token: Some(token),
            expires_at: exposure.expires_at,
        })
    }

    /// `ports.list`: the session's ports exposed now (tokens are not kept, so none shown).
    pub async fn list(
        &self,
        ctx: RequestContext,
        req: PortRef,
    ) -> Result<PortList, SchedulerError> {
        let id = ctx.caller.scope("session_id", &req.session_id)?;
        let record = self.session(&id, &req.session_id).await?;
        let now = messages::now_ms();
        let ports = record
            .ports
            .iter()
            .filter(|(_, e)| e.expires_at > now)
            .map(|(port, e)| ExposedPort {
                session_id: req.session_id.clone(),
                port: *port,
                url: port_path(&req.session_id, *port),
                token: None,
                expires_at: e.expires_at,
            })
            .collect();
        Ok(PortList { ports })
    }

    /// `ports.unexpose`: the port's token stops working; tunnels open now run on until they
    /// close (the record is not on their path).
    pub async fn unexpose(
        &self,
        ctx: RequestContext,
        req: PortRef,
    ) -> Result<PortList, SchedulerError> {
        let port = messages::ports::validate_port(req.port.unwrap_or(0))?;
        let id = ctx.caller.scope("session_id", &req.session_id)?;
        self.session(&id, &req.session_id).await?;
        let mut had = false;
        self.table
            .update(&id, |r| {
                had = r.ports.remove(&port).is_some();
                if had {
                    Change::Write
                } else {
                    Change::Keep
                }
            })
            .await?;
        if !had {
            return Err(PortError::NotExposed {
                id: req.session_id,
                port,
            }
            .into());
        }
        self.list(ctx, PortRef { port: None, ..req }).await
    }

    /// `ports.connect`: checks the port is exposed (and the token, when one is given), then
    /// has the session's node open the tunnel.
    pub async fn connect(
        &self,
        ctx: RequestContext,
        req: TunnelConnect,
    ) -> Result<TunnelOpened, SchedulerError> {
        let port = req.admit()?;
        let id = ctx.caller.scope("session_id", &req.session_id)?;
        let record = self.session(&id, &req.session_id).await?;
        let named = || req.session_id.clone();
        let now = messages::now_ms();
        let exposure = record.ports.get(&port).filter(|e| e.expires_at > now);
        match (&req.token, exposure) {
            (Some(token), Some(e)) if sha256_hex(token) == e.token_sha256 => {}
            (Some(_), _) => return Err(PortError::BadToken { id: named(), port }.into()),
            (None, Some(_)) => {}
            (None, None) => return Err(PortError::NotExposed { id: named(), port }.into()),
        }
        let node = match (record.state, record.node) {
            (SessionState::Active, Some(node)) => node,
            (SessionState::Lost, _) => return Err(PortError::Lost { id: named() }.into()),
            _ => return Err(PortError::NoContainer { id: named() }.into()),
        };
        let order = ExecutorTunnel {
            session_id: id,
            port,
            tunnel_id: req.tunnel_id,
            tenant: ctx.caller.tenant().cloned(),
        };
        self.executor
            .open_tunnel(&node, &order)
            .await
            .map_err(SchedulerError::calling(ServiceName::DockerExecutor))
    }
}
