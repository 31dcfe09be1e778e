//! The risk-assessor: static risk of code and browser actions.

use messages::risk::{AssessRequest, RiskAssessment};

use crate::{MeshClient, Result};

#[derive(Debug, Clone)]
pub struct RiskClient {
    mesh: MeshClient,
}

impl RiskClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    pub async fn assess(&self, req: &AssessRequest) -> Result<RiskAssessment> {
        self.mesh
            .request(self.mesh.subjects().risk_assess(), req)
            .await
    }
}
