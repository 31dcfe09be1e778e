//! `Catalog`: the `sandbox_templates` bucket behind the five endpoints. One actor per
//! instance so this instance's writes apply in the order they came; across instances the
//! bucket's own compare-and-set decides (`create` only when absent, `update` at the revision
//! read), so two instances never overwrite each other unseen.

use async_nats::jetstream::kv::{self, CreateErrorKind, Operation, UpdateErrorKind};
use bytes::Bytes;
use futures::TryStreamExt;
use kit::RequestContext;
use messages::template::{
    builtins, validate_name, Template, TemplateList, TemplateListReply, TemplateRecord, TemplateRef,
};
use messages::tenancy::Caller;
use messages::ErrorBody;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

type Reply<T> = RpcReplyPort<Result<T, ErrorBody>>;

pub enum CatalogMsg {
    Get(RequestContext, TemplateRef, Reply<TemplateRecord>),
    List(RequestContext, TemplateList, Reply<TemplateListReply>),
    Create(RequestContext, Template, Reply<TemplateRecord>),
    Update(RequestContext, Template, Reply<TemplateRecord>),
    Delete(RequestContext, TemplateRef, Reply<TemplateRecord>),
}

pub struct Catalog;

/// The bucket, and nothing else: every answer is read from it, so instances agree.
pub struct CatalogState {
    kv: kv::Store,
}

/// Templates are the operators' to write: an agent may only read them.
fn may_write(caller: &Caller) -> Result<(), ErrorBody> {
    match caller {
        Caller::Agent { tenant, .. } => Err(ErrorBody::denied(format!(
            "agents of tenant {tenant} may read templates, not write them; ask an operator"
        ))),
        Caller::Internal | Caller::Operator { .. } => Ok(()),
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::unavailable(format!("the templates bucket did not {what}: {e}"))
}

fn encode(record: &TemplateRecord) -> Bytes {
    Bytes::from(serde_json::to_vec(record).expect("a TemplateRecord serialises to JSON"))
}

impl CatalogState {
    async fn read(&self, name: &str) -> Result<Option<(TemplateRecord, u64)>, ErrorBody> {
        let entry = self
            .kv
            .entry(name)
            .await
            .map_err(|e| unavailable("read", e))?;
        match entry {
            Some(e) if e.operation == Operation::Put => {
                let record = serde_json::from_slice(&e.value).map_err(|err| {
                    ErrorBody::internal(format!("template {name:?} is corrupt: {err}"))
                })?;
                Ok(Some((record, e.revision)))
            }
            _ => Ok(None),
        }
    }

    async fn get(&self, name: &str) -> Result<TemplateRecord, ErrorBody> {
        validate_name(name)?;
        match self.read(name).await? {
            Some((record, _)) => Ok(record),
            None => Err(ErrorBody::not_found(format!(
                "no template {name:?} (sandmesh template list shows them)"
            ))),
        }
    }

    async fn list(&self) -> Result<TemplateListReply, ErrorBody> {
        let mut names: Vec<String> = self
            .kv
            .keys()
            .await
            .map_err(|e| unavailable("list", e))?
            .try_collect()
            .await
            .map_err(|e| unavailable("list", e))?;
        names.sort();
        let mut templates = Vec::with_capacity(names.len());
        for name in names {
            // Deleted between the listing and the read: not there any more.
            if let Some((record, _)) = self.read(&name).await? {
                templates.push(record);
            }
        }
        Ok(TemplateListReply { templates })
    }

    /// Stores a new template; `Ok(None)` when one of that name exists.
    async fn insert(&self, record: TemplateRecord) -> Result<Option<TemplateRecord>, ErrorBody> {
        match self.kv.create(&record.template.name, encode(&record)).await {
            Ok(_) => Ok(Some(record)),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(unavailable("store", e)),
        }
    }

    async fn create(&self, template: Template) -> Result<TemplateRecord, ErrorBody> {
        template.validate()?;
        let now = messages::now_ms();
        let name = template.name.clone();
        let record = TemplateRecord {
            template,
            builtin: false,
            created_at: now,
            updated_at: now,
        };
        self.insert(record).await?.ok_or_else(|| {
            ErrorBody::conflict(format!("template {name:?} exists; use update to change it"))
        })
    }

    async fn update(&self, template: Template) -> Result<TemplateRecord, ErrorBody> {
        template.validate()?;
        let name = template.name.clone();
        let Some((old, revision)) = self.read(&name).await? else {
            return Err(ErrorBody::not_found(format!(
                "no template {name:?}; use create to add it"
            )));
        };
        let record = TemplateRecord {
            template,
            updated_at: messages::now_ms(),
            ..old
        };
        match self.kv.update(&name, encode(&record), revision).await {
            Ok(_) => Ok(record),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Err(ErrorBody::conflict(
                format!("template {name:?} changed while it was updated; read it and try again"),
            )),
            Err(e) => Err(unavailable("store", e)),
        }
    }

    async fn delete(&self, name: &str) -> Result<TemplateRecord, ErrorBody> {
        let record = self.get(name).await?;
        self.kv
            .delete(name)
            .await
            .map_err(|e| unavailable("delete", e))?;
        Ok(record)
    }
}

impl Actor for Catalog {
    type Msg = CatalogMsg;
    type State = CatalogState;
    type Arguments = kv::Store;

    /// Puts the built-ins in the bucket when absent; a changed one is left as the operator
    /// made it.
    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        kv: kv::Store,
    ) -> Result<Self::State, ActorProcessingErr> {
        let state = CatalogState { kv };
        let now = messages::now_ms();
        for template in builtins() {
            let name = template.name.clone();
            let added = state
                .insert(TemplateRecord {
                    template,
                    builtin: true,
                    created_at: now,
                    updated_at: now,
                })
                .await
                .map_err(|e| format!("putting built-in template {name}: {}", e.message))?;
            if added.is_some() {
                tracing::info!(template = %name, "built-in template added");
            }
        }
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CatalogMsg::Get(_, r, reply) => {
                let _ = reply.send(state.get(&r.name).await);
            }
            CatalogMsg::List(_, TemplateList {}, reply) => {
                let _ = reply.send(state.list().await);
            }
            CatalogMsg::Create(ctx, template, reply) => {
                let done = match may_write(&ctx.caller) {
                    Ok(()) => state.create(template).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(done);
            }
            CatalogMsg::Update(ctx, template, reply) => {
                let done = match may_write(&ctx.caller) {
                    Ok(()) => state.update(template).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(done);
            }
            CatalogMsg::Delete(ctx, r, reply) => {
                let done = match may_write(&ctx.caller) {
                    Ok(()) => state.delete(&r.name).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(done);
            }
        }
        Ok(())
    }
}
