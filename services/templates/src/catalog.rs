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
use messages::validate::ValidationError;
use messages::ErrorBody;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

type Reply<T> = RpcReplyPort<Result<T, CatalogError>>;

type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a template call failed, with its cause; the wire's [`ErrorBody`] is made from it at the
/// endpoint.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("agents of tenant {tenant} may read templates, not write them; ask an operator")]
    AgentsOnlyRead { tenant: String },
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("no template {name:?} (sandmesh template list shows them)")]
    Unknown { name: String },
    #[error("no template {name:?}; use create to add it")]
    UpdateOfUnknown { name: String },
    #[error("template {name:?} exists; use update to change it")]
    Exists { name: String },
    #[error("template {name:?} changed while it was updated; read it and try again")]
    ChangedMeanwhile { name: String },
    #[error("template {name:?} is corrupt: {source}")]
    Corrupt {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the templates bucket did not {what}: {source}")]
    Bucket {
        what: &'static str,
        #[source]
        source: Cause,
    },
}

impl From<CatalogError> for ErrorBody {
    fn from(e: CatalogError) -> Self {
        let message = e.to_string();
        match e {
            CatalogError::AgentsOnlyRead { .. } => ErrorBody::denied(message),
            CatalogError::Invalid(v) => v.into(),
            CatalogError::Unknown { .. } | CatalogError::UpdateOfUnknown { .. } => {
                ErrorBody::not_found(message)
            }
            CatalogError::Exists { .. } | CatalogError::ChangedMeanwhile { .. } => {
                ErrorBody::conflict(message)
            }
            CatalogError::Corrupt { .. } => ErrorBody::internal(message),
            CatalogError::Bucket { .. } => ErrorBody::unavailable(message),
        }
    }
}

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
fn may_write(caller: &Caller) -> Result<(), CatalogError> {
    match caller {
        Caller::Agent { tenant, .. } => Err(CatalogError::AgentsOnlyRead {
            tenant: tenant.to_string(),
        }),
        Caller::Internal | Caller::Operator { .. } => Ok(()),
    }
}

/// A closure for `map_err`: the bucket failed at `what`.
fn bucket<E: Into<Cause>>(what: &'static str) -> impl FnOnce(E) -> CatalogError {
    move |e| CatalogError::Bucket {
        what,
        source: e.into(),
    }
}

fn encode(record: &TemplateRecord) -> Bytes {
    Bytes::from(serde_json::to_vec(record).expect("a TemplateRecord serialises to JSON"))
}

impl CatalogState {
    async fn read(&self, name: &str) -> Result<Option<(TemplateRecord, u64)>, CatalogError> {
        let entry = self.kv.entry(name).await.map_err(bucket("read"))?;
        match entry {
            Some(e) if e.operation == Operation::Put => {
                let record =
                    serde_json::from_slice(&e.value).map_err(|source| CatalogError::Corrupt {
                        name: name.to_string(),
                        source,
                    })?;
                Ok(Some((record, e.revision)))
            }
            _ => Ok(None),
        }
    }

    async fn get(&self, name: &str) -> Result<TemplateRecord, CatalogError> {
        validate_name(name)?;
        match self.read(name).await? {
            Some((record, _)) => Ok(record),
            None => Err(CatalogError::Unknown { name: name.into() }),
        }
    }

    async fn list(&self) -> Result<TemplateListReply, CatalogError> {
        let mut names: Vec<String> = self
            .kv
            .keys()
            .await
            .map_err(bucket("list"))?
            .try_collect()
            .await
            .map_err(bucket("list"))?;
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
    async fn insert(&self, record: TemplateRecord) -> Result<Option<TemplateRecord>, CatalogError> {
        match self.kv.create(&record.template.name, encode(&record)).await {
            Ok(_) => Ok(Some(record)),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(bucket("store")(e)),
        }
    }

    async fn create(&self, template: Template) -> Result<TemplateRecord, CatalogError> {
        template.validate()?;
        let now = messages::now_ms();
        let name = template.name.clone();
        let record = TemplateRecord {
            template,
            builtin: false,
            created_at: now,
            updated_at: now,
        };
        self.insert(record)
            .await?
            .ok_or(CatalogError::Exists { name })
    }

    async fn update(&self, template: Template) -> Result<TemplateRecord, CatalogError> {
        template.validate()?;
        let name = template.name.clone();
        let Some((old, revision)) = self.read(&name).await? else {
            return Err(CatalogError::UpdateOfUnknown { name });
        };
        let record = TemplateRecord {
            template,
            updated_at: messages::now_ms(),
            ..old
        };
        match self.kv.update(&name, encode(&record), revision).await {
            Ok(_) => Ok(record),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => {
                Err(CatalogError::ChangedMeanwhile { name })
            }
            Err(e) => Err(bucket("store")(e)),
        }
    }

    async fn delete(&self, name: &str) -> Result<TemplateRecord, CatalogError> {
        let record = self.get(name).await?;
        self.kv.delete(name).await.map_err(bucket("delete"))?;
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
                .map_err(|e| format!("putting built-in template {name}: {e}"))?;
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

#[cfg(test)]
mod tests {
    use messages::ErrorKind;

    use super::*;

    /// The refusals the black-box tests cannot provoke (a corrupt record, a bucket that fails,
    /// a race lost between two operators) are answered with their kind and their message too.
    #[test]
    fn every_refusal_is_answered_with_its_kind() {
        let corrupt = serde_json::from_slice::<TemplateRecord>(b"{").unwrap_err();
        let name = || "python-data".to_string();
        for (e, kind) in [
            (
                CatalogError::AgentsOnlyRead {
                    tenant: "acme".into(),
                },
                ErrorKind::Denied,
            ),
            (CatalogError::Unknown { name: name() }, ErrorKind::NotFound),
            (
                CatalogError::UpdateOfUnknown { name: name() },
                ErrorKind::NotFound,
            ),
            (CatalogError::Exists { name: name() }, ErrorKind::Conflict),
            (
                CatalogError::ChangedMeanwhile { name: name() },
                ErrorKind::Conflict,
            ),
            (
                CatalogError::Corrupt {
                    name: name(),
                    source: corrupt,
                },
                ErrorKind::Internal,
            ),
            (
                bucket("read")(std::io::Error::other("no responders")),
                ErrorKind::Unavailable,
            ),
        ] {
            let message = e.to_string();
            let body = ErrorBody::from(e);
            assert_eq!((body.kind, body.code), (kind, kind.code()), "{message}");
            assert_eq!(body.message, message);
        }
        let invalid = ValidationError::invalid("name", "empty");
        assert_eq!(
            ErrorBody::from(CatalogError::from(invalid.clone())),
            ErrorBody::from(invalid)
        );
    }
}
