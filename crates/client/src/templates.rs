//! Templates: the environments code runs in. Everyone reads them; only operators and the
//! deployment's own users may write (an agent's write is refused).

use messages::subjects::TemplateOp;
use messages::template::{Template, TemplateList, TemplateListReply, TemplateRecord, TemplateRef};

use crate::{MeshClient, Result};

#[derive(Debug, Clone)]
pub struct TemplateClient {
    mesh: MeshClient,
}

impl TemplateClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    fn subject(&self, op: TemplateOp) -> String {
        self.mesh.subjects().templates(op)
    }

    pub async fn get(&self, name: &str) -> Result<TemplateRecord> {
        let r = TemplateRef { name: name.into() };
        self.mesh.request(self.subject(TemplateOp::Get), &r).await
    }

    /// Every template, sorted by name.
    pub async fn list(&self) -> Result<Vec<TemplateRecord>> {
        let reply: TemplateListReply = self
            .mesh
            .request(self.subject(TemplateOp::List), &TemplateList {})
            .await?;
        Ok(reply.templates)
    }

    /// Adds a template (a conflict when the name is taken).
    pub async fn create(&self, template: &Template) -> Result<TemplateRecord> {
        self.mesh
            .request(self.subject(TemplateOp::Create), template)
            .await
    }

    /// Replaces a template (not found when there is none of that name).
    pub async fn update(&self, template: &Template) -> Result<TemplateRecord> {
        self.mesh
            .request(self.subject(TemplateOp::Update), template)
            .await
    }

    /// Removes a template; returns what it was.
    pub async fn delete(&self, name: &str) -> Result<TemplateRecord> {
        let r = TemplateRef { name: name.into() };
        self.mesh
            .request(self.subject(TemplateOp::Delete), &r)
            .await
    }
}
