//! The executor nodes' own subjects (`executor.<backend>.run`, `executor.<backend>.<node>.*`):
//! the scheduler's calls and the executors' tests. Tenants cannot reach them, so this module is
//! behind the `internal` feature; the policy around a run (retries, recovering a lost reply) is
//! the caller's.

use std::time::Duration;

use messages::exec::ExecResult;
use messages::executor::{
    Backend, ExecutorClose, ExecutorDrain, ExecutorRun, ExecutorRunStatus, ExecutorStatusQuery,
};
use messages::proc::{ProcCall, ProcReply};
use messages::subjects::ExecutorOp;
use messages::workspace::Ack;

use crate::{ClientError, MeshClient, Result};

#[derive(Debug, Clone)]
pub struct ExecutorClient {
    mesh: MeshClient,
}

impl ExecutorClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// Runs `run` on `node` of `backend`, or on that backend's queue group when `None`. The
    /// executor answers when the run ends, so `timeout` is the run's whole budget.
    pub async fn run(
        &self,
        backend: Backend,
        node: Option<&str>,
        run: &ExecutorRun,
        timeout: Duration,
    ) -> Result<ExecResult> {
        let subjects = self.mesh.subjects();
        let subject = match node {
            Some(node) => subjects.executor_node_on(backend, node, ExecutorOp::Run),
            None => subjects.executor_run_on(backend),
        };
        self.mesh.request_timeout(subject, run, timeout).await
    }

    /// What `node` knows of an execution it was sent: running, finished (with its answer),
    /// unknown or forgotten. A node answers it from memory.
    pub async fn status(
        &self,
        backend: Backend,
        node: &str,
        query: &ExecutorStatusQuery,
        timeout: Duration,
    ) -> Result<ExecutorRunStatus> {
        let subject = self
            .mesh
            .subjects()
            .executor_node_on(backend, node, ExecutorOp::Status);
        self.mesh.request_timeout(subject, query, timeout).await
    }

    /// Closes `session_id`'s container on a docker node. A node nothing answers for is gone,
    /// and its containers with it: that is a close too.
    pub async fn close_session(&self, node: &str, session_id: &str) -> Result<()> {
        let close = ExecutorClose {
            session_id: session_id.to_string(),
        };
        let subject = self.mesh.subjects().executor_node(node, ExecutorOp::Close);
        match self.mesh.request::<_, Ack>(subject, &close).await {
            Ok(_) | Err(ClientError::NoResponders { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Opens a tunnel into a port of a session container on docker `node`: answered once the
    /// node reached the port and listens on the tunnel's up subject.
    pub async fn open_tunnel(
        &self,
        node: &str,
        order: &messages::ports::ExecutorTunnel,
    ) -> Result<messages::ports::TunnelOpened> {
        let subject = self.mesh.subjects().executor_tunnel(node);
        self.mesh.request(subject, order).await
    }

    /// One background-process operation on the node holding its session; `timeout` covers
    /// a `wait`'s own bound.
    pub async fn proc(
        &self,
        backend: Backend,
        node: &str,
        call: &ProcCall,
        timeout: Duration,
    ) -> Result<ProcReply> {
        let subject = self
            .mesh
            .subjects()
            .executor_node_on(backend, node, ExecutorOp::Proc);
        self.mesh.request_timeout(subject, call, timeout).await
    }

    /// Tells `node` of `backend` to take no new work (it finishes what runs).
    pub async fn drain(&self, backend: Backend, node: &str) -> Result<Ack> {
        let subject = self
            .mesh
            .subjects()
            .executor_node_on(backend, node, ExecutorOp::Drain);
        self.mesh.request(subject, &ExecutorDrain {}).await
    }
}
