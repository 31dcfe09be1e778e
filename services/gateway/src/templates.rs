//! Templates over HTTP: agents read them; writing is an
//! operator's. An API key acts as one tenant's agent, and NATS refuses template writes to
//! agents (the account's permissions, and the templates service checks the caller again), so
//! the write routes exist — a seed client finds them — and answer `403 denied` saying where
//! templates are written, instead of sending a request the NATS server would drop.

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use messages::template::{Template, TemplateListReply, TemplateRecord};

use crate::api::{Agent, Params};
use crate::problem::{Errors, Problem, Reply};

/// Every template, sorted by name.
#[utoipa::path(
    get,
    path = "/api/v1/templates",
    operation_id = "list_templates",
    responses((status = 200, description = "every template", body = TemplateListReply), Errors)
)]
pub async fn list(agent: Agent) -> Reply {
    let templates = agent.mesh.templates().list().await?;
    Ok(Json(TemplateListReply { templates }).into_response())
}

#[utoipa::path(
    get,
    path = "/api/v1/templates/{name}",
    operation_id = "get_template",
    params(("name" = String, Path, description = "the template's name", pattern = r"^[a-z][a-z0-9-]{0,62}$")),
    responses((status = 200, description = "the template", body = TemplateRecord), Errors)
)]
pub async fn get(agent: Agent, Params(name): Params<String>) -> Reply {
    Ok(Json(agent.mesh.templates().get(&name).await?).into_response())
}

/// Refused to API keys (they act as a tenant's agents): `sandmesh template create`.
#[utoipa::path(
    post,
    path = "/api/v1/templates",
    operation_id = "create_template",
    request_body = Template,
    responses(Errors)
)]
pub async fn create(_agent: Agent) -> Reply {
    Err(operators_only())
}

/// Refused to API keys (they act as a tenant's agents): `sandmesh template update`.
#[utoipa::path(
    put,
    path = "/api/v1/templates/{name}",
    operation_id = "update_template",
    params(("name" = String, Path, description = "the template's name", pattern = r"^[a-z][a-z0-9-]{0,62}$")),
    request_body = Template,
    responses(Errors)
)]
pub async fn update(_agent: Agent) -> Reply {
    Err(operators_only())
}

/// Refused to API keys (they act as a tenant's agents): `sandmesh template delete`.
#[utoipa::path(
    delete,
    path = "/api/v1/templates/{name}",
    operation_id = "delete_template",
    params(("name" = String, Path, description = "the template's name", pattern = r"^[a-z][a-z0-9-]{0,62}$")),
    responses(Errors)
)]
pub async fn delete(_agent: Agent) -> Reply {
    Err(operators_only())
}

fn operators_only() -> Problem {
    Problem::new(
        StatusCode::FORBIDDEN,
        sandmesh_client::ErrorKind::Denied.as_str(),
        "templates are written by operators (`sandmesh template create|update|delete`); an API \
         key acts as its tenant's agent, which may only read them",
    )
}
