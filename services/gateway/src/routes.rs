//! The HTTP API's routes: each path and method to its handler, with the layers every request
//! passes (ports by host name, body caps and the body idle timeout).

use std::sync::Arc;

use axum::routing::{any, get, post};
use axum::Router;

use crate::api::{
    close_session, execute, execute_in_session, execution, get_session, health, list_sessions,
    open_session, run_tests, runtimes, App,
};
use crate::problem::Problem;
use crate::{body, files, openapi, ports, procs, templates};

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/api/v1/health", get(health))
        .route("/api/v1/openapi.json", get(openapi::document))
        .route("/api/v1/runtimes", get(runtimes))
        .route("/api/v1/execute", post(execute))
        .route("/api/v1/test", post(run_tests))
        .route("/api/v1/sessions", post(open_session).get(list_sessions))
        .route(
            "/api/v1/sessions/{id}",
            get(get_session).delete(close_session),
        )
        .route("/api/v1/sessions/{id}/execute", post(execute_in_session))
        .route("/api/v1/executions/{id}", get(execution))
        .route(
            "/api/v1/templates",
            get(templates::list).post(templates::create),
        )
        .route(
            "/api/v1/templates/{name}",
            get(templates::get)
                .put(templates::update)
                .delete(templates::delete),
        )
        .route(
            "/api/v1/sessions/{id}/files",
            get(files::list).post(files::upload_form),
        )
        .route(
            "/api/v1/sessions/{id}/files/{*path}",
            get(files::download)
                .put(files::upload)
                .post(files::upload_by_post)
                .delete(files::delete),
        )
        .route(
            "/api/v1/sessions/{id}/processes",
            post(procs::start).get(procs::list),
        )
        .route(
            "/api/v1/sessions/{id}/processes/{proc_id}",
            axum::routing::delete(procs::kill),
        )
        .route(
            "/api/v1/sessions/{id}/processes/{proc_id}/output",
            get(procs::output),
        )
        .route(
            "/api/v1/sessions/{id}/processes/{proc_id}/input",
            post(procs::input),
        )
        .route(
            "/api/v1/sessions/{id}/procs/{proc_id}/ws",
            get(procs::terminal),
        )
        .route(
            "/api/v1/sessions/{id}/ports",
            post(ports::expose).get(ports::list),
        )
        .route(
            "/api/v1/sessions/{id}/ports/{port}",
            get(ports::to_root).delete(ports::unexpose),
        )
        .route(
            "/api/v1/sessions/{id}/ports/{port}/",
            any(ports::proxy_path),
        )
        .route(
            "/api/v1/sessions/{id}/ports/{port}/{*path}",
            any(ports::proxy_path),
        )
        .fallback(|| async { Problem::not_found("no such route") })
        // `{port}-{session}.localhost` is a port of a session, whatever the path.
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            ports::host_routing,
        ))
        // Body caps are the extractors' (per route: files may be larger than JSON), checked
        // as the body streams in; axum's default cap would cut uploads at 2 MB.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            body::idle_timeout,
        ))
        .with_state(app)
}
