//! The services of the mesh by name. A name is protocol, not decoration: it is the first token
//! of every heartbeat key (`<service>.<instance_id>` in `sandbox_nodes`), the queue group and
//! the `$SRV.*.<service>` discovery subjects, so it is spelled once, here.

use std::fmt;
use std::str::FromStr;

/// One kind of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceName {
    RiskAssessor,
    Confirmation,
    Scheduler,
    DockerExecutor,
    BwrapExecutor,
    WorkspaceStore,
    AioPool,
    BrowserRouter,
    Console,
    Gateway,
    Templates,
}

impl ServiceName {
    pub const ALL: &'static [ServiceName] = &[
        ServiceName::RiskAssessor,
        ServiceName::Confirmation,
        ServiceName::Scheduler,
        ServiceName::DockerExecutor,
        ServiceName::BwrapExecutor,
        ServiceName::WorkspaceStore,
        ServiceName::AioPool,
        ServiceName::BrowserRouter,
        ServiceName::Console,
        ServiceName::Gateway,
        ServiceName::Templates,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ServiceName::RiskAssessor => "risk-assessor",
            ServiceName::Confirmation => "confirmation",
            ServiceName::Scheduler => "scheduler",
            ServiceName::DockerExecutor => "docker-executor",
            ServiceName::BwrapExecutor => "bwrap-executor",
            ServiceName::WorkspaceStore => "workspace-store",
            ServiceName::AioPool => "aio-pool",
            ServiceName::BrowserRouter => "browser-router",
            ServiceName::Console => "console",
            ServiceName::Gateway => "gateway",
            ServiceName::Templates => "templates",
        }
    }

    /// This instance's heartbeat key: `<service>.<instance_id>`.
    pub fn heartbeat_key(self, instance_id: &str) -> String {
        crate::heartbeat::heartbeat_key(self.as_str(), instance_id)
    }

    /// The KV key filter matching every instance's heartbeat: `<service>.*`.
    pub fn heartbeat_filter(self) -> String {
        format!("{}.*", self.as_str())
    }

    /// The service and instance a heartbeat key names, if it names a known service.
    pub fn parse_heartbeat_key(key: &str) -> Option<(ServiceName, &str)> {
        let (service, instance) = key.split_once('.')?;
        Some((service.parse().ok()?, instance))
    }

    /// `$SRV.PING.<service>`: every instance of this service answers.
    pub fn srv_ping(self) -> String {
        srv(SrvVerb::Ping, Some(self))
    }

    /// `$SRV.INFO.<service>`: every instance describes its endpoints.
    pub fn srv_info(self) -> String {
        srv(SrvVerb::Info, Some(self))
    }

    /// `$SRV.STATS.<service>`: every instance reports its endpoint statistics.
    pub fn srv_stats(self) -> String {
        srv(SrvVerb::Stats, Some(self))
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown service {0:?}: expected one of {known}", known = known_names())]
pub struct UnknownService(pub String);

fn known_names() -> String {
    let names: Vec<&str> = ServiceName::ALL.iter().map(|n| n.as_str()).collect();
    names.join(", ")
}

impl FromStr for ServiceName {
    type Err = UnknownService;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ServiceName::ALL
            .iter()
            .copied()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| UnknownService(s.to_string()))
    }
}

/// The verbs of the NATS services protocol every service answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrvVerb {
    Ping,
    Info,
    Stats,
}

impl SrvVerb {
    pub const fn as_str(self) -> &'static str {
        match self {
            SrvVerb::Ping => "PING",
            SrvVerb::Info => "INFO",
            SrvVerb::Stats => "STATS",
        }
    }
}

/// `$SRV.<VERB>` (every service) or `$SRV.<VERB>.<service>` (every instance of one). These
/// subjects are fixed by the protocol, not under the mesh's prefix.
pub fn srv(verb: SrvVerb, service: Option<ServiceName>) -> String {
    match service {
        Some(service) => format!("$SRV.{}.{service}", verb.as_str()),
        None => format!("$SRV.{}", verb.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back() {
        for name in ServiceName::ALL {
            assert_eq!(name.as_str().parse::<ServiceName>(), Ok(*name));
        }
        let e = "docker_executor".parse::<ServiceName>().unwrap_err();
        assert!(
            e.to_string()
                .contains("docker-executor, bwrap-executor, workspace-store"),
            "{e}"
        );
    }

    #[test]
    fn heartbeat_keys_and_srv_subjects() {
        let exec = ServiceName::DockerExecutor;
        assert_eq!(exec.heartbeat_key("n1"), "docker-executor.n1");
        assert_eq!(exec.heartbeat_filter(), "docker-executor.*");
        assert_eq!(
            ServiceName::parse_heartbeat_key("docker-executor.n1"),
            Some((exec, "n1"))
        );
        assert_eq!(ServiceName::parse_heartbeat_key("nobody.n1"), None);
        assert_eq!(exec.srv_ping(), "$SRV.PING.docker-executor");
        assert_eq!(srv(SrvVerb::Ping, None), "$SRV.PING");
        assert_eq!(ServiceName::Scheduler.srv_info(), "$SRV.INFO.scheduler");
    }
}
