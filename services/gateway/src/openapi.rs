//! The OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]` attributes and the
//! bodies' own types: the `messages` payloads derive their schemas behind that crate's
//! `openapi` feature (so the protocol and its HTTP description cannot drift apart, and
//! `messages` keeps no runtime dependency), the gateway's few own bodies derive theirs here.

use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use messages::exec::{AwaitingConfirmation, OutputChunk};

use crate::problem::Problem;
use crate::{api, files, ports, procs, templates};

/// `Authorization: Bearer <key>` on every call but health and this document.
struct BearerKeys;

impl Modify for BearerKeys {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        let mut scheme = Http::new(HttpAuthScheme::Bearer);
        scheme.description = Some("an API key: `sandmesh tenant key create TENANT`".into());
        components.add_security_scheme("key", SecurityScheme::Http(scheme));
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandmesh",
        description = "Safe code execution for AI agents: the HTTP face of the mesh. Bodies are \
                       the mesh's NATS messages, as JSON."
    ),
    paths(
        api::health,
        document,
        api::runtimes,
        api::execute,
        api::run_tests,
        api::open_session,
        api::list_sessions,
        api::get_session,
        api::close_session,
        api::execute_in_session,
        api::execution,
        files::list,
        files::upload,
        files::upload_by_post,
        files::upload_form,
        files::download,
        files::delete,
        templates::list,
        templates::get,
        templates::create,
        templates::update,
        templates::delete,
        procs::start,
        procs::list,
        procs::output,
        procs::input,
        procs::kill,
        ports::expose,
        ports::list,
        ports::unexpose,
        ports::to_root,
    ),
    // The event payloads of a streamed execution (not response bodies of their own).
    components(schemas(Problem, OutputChunk, AwaitingConfirmation)),
    modifiers(&BearerKeys),
    security(("key" = []))
)]
pub struct ApiDoc;

/// The document itself.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    security(()),
    responses((status = 200, description = "this API's OpenAPI 3.1 document", body = Object))
)]
pub async fn document() -> Response {
    Json(ApiDoc::openapi()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_described_with_its_bodies() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().unwrap();
        for path in [
            "/api/v1/execute",
            "/api/v1/test",
            "/api/v1/sessions/{id}/execute",
            "/api/v1/sessions/{id}/files/{path}",
            "/api/v1/executions/{id}",
            "/api/v1/templates",
            "/api/v1/templates/{name}",
        ] {
            assert!(paths.contains_key(path), "{path} missing");
        }
        // What the mesh accepts, said in the document: ids of 1–64 of `[A-Za-z0-9_-]`, a
        // session opened without a body, an execution only with one.
        let id = &doc["paths"]["/api/v1/sessions/{id}"]["get"]["parameters"][0];
        assert_eq!(id["schema"]["pattern"], "^[A-Za-z0-9_-]{1,64}$", "{id}");
        let open = &doc["paths"]["/api/v1/sessions"]["post"]["requestBody"];
        assert_ne!(open["required"], true, "{open}");
        let exec = &doc["paths"]["/api/v1/execute"]["post"]["requestBody"];
        assert_eq!(exec["required"], true, "{exec}");
        // Every operation has an id of its own (validators refuse a document without).
        let mut ids = std::collections::BTreeSet::new();
        for (path, item) in paths {
            let methods = ["get", "put", "post", "delete", "patch", "head", "options"];
            let item = item.as_object().unwrap();
            for (method, op) in item.iter().filter(|(m, _)| methods.contains(&m.as_str())) {
                let id = op["operationId"].as_str().unwrap_or_default();
                assert!(
                    ids.insert(id.to_string()),
                    "{method} {path}: operationId {id:?} twice"
                );
            }
        }
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for schema in [
            "ExecRequest",
            "ExecResult",
            "SessionRecord",
            "TemplateRecord",
            "Problem",
            "OutputChunk",
        ] {
            assert!(schemas.contains_key(schema), "{schema} missing");
        }
        // A session opens with what every execution in it gets and how long it lives.
        let open = &schemas["SessionOpen"]["properties"];
        for field in [
            "env",
            "timeout_ms",
            "ttl_ms",
            "idle_ms",
            "template",
            "network",
            "filesystem",
        ] {
            assert!(
                open.get(field).is_some(),
                "SessionOpen.{field} missing: {open}"
            );
        }
        let record = &schemas["SessionRecord"]["properties"];
        for field in [
            "env",
            "timeout_ms",
            "expires_at",
            "closed_at",
            "close_reason",
        ] {
            assert!(record.get(field).is_some(), "SessionRecord.{field} missing");
        }
        // A run's files its workspace did not take are named in its result.
        let result = &schemas["ExecResult"]["properties"];
        for field in ["files_refused", "files_omitted"] {
            assert!(result.get(field).is_some(), "ExecResult.{field} missing");
        }
        assert!(schemas.contains_key("RefusedFile"), "RefusedFile missing");
    }

    /// What the bodies refuse, the document says: a request body and every object in it takes
    /// no property it does not list, so a generator never makes one the gateway rightly
    /// refuses. Answers stay open, for clients reading a newer gateway's.
    #[test]
    fn request_bodies_are_closed_and_answers_open() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for closed in [
            "ExecRequest",
            "TestRequest",
            "SessionOpen",
            "Template",
            "ProcStartFields",
            "InputBody",
            "ExposeBody",
            "NetworkPolicy",
            "FilesystemPolicy",
            "Limits",
            "FileSpec",
            "PtySize",
        ] {
            let schema = &schemas[closed];
            assert_eq!(schema["additionalProperties"], false, "{closed}: {schema}");
        }
        for open in [
            "ExecResult",
            "SessionRecord",
            "TemplateRecord",
            "ProcInfo",
            "Problem",
        ] {
            let schema = &schemas[open];
            assert!(schema.is_object(), "{open} missing");
            assert!(
                schema.get("additionalProperties").is_none(),
                "{open}: {schema}"
            );
        }
        // A process's command: the fields, and exactly one of `cmd` and `argv`.
        let start = &schemas["ProcStart"]["allOf"];
        assert_eq!(
            start[0]["$ref"], "#/components/schemas/ProcStartFields",
            "{start}"
        );
        let one_of = start[1]["oneOf"].as_array().unwrap();
        let required: Vec<_> = one_of.iter().map(|s| s["required"].clone()).collect();
        assert_eq!(
            required,
            [serde_json::json!(["cmd"]), serde_json::json!(["argv"])]
        );
        assert_eq!(one_of[0]["properties"]["cmd"]["type"], "string", "{start}");
        assert_eq!(one_of[1]["properties"]["argv"]["type"], "array", "{start}");
        let body = &doc["paths"]["/api/v1/sessions/{id}/processes"]["post"]["requestBody"];
        let schema = &body["content"]["application/json"]["schema"];
        assert_eq!(schema["$ref"], "#/components/schemas/ProcStart", "{body}");
    }
}
