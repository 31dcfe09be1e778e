//! The template an execution names (`ExecRequest::template`): read from the templates
//! service and folded into the request *before* validation, so its defaults pass the same
//! ceilings as anything a client asks for (its network policy included: clamped by the
//! operator's ceiling). The executor gets only what it needs to pick the image
//! ([`RunTemplate`]) and the template's filesystem policy ([`Resolved`]).

use messages::exec::{ExecRequest, Limits};
use messages::filesystem::FilesystemPolicy;
use messages::template::{RunTemplate, Template};
use messages::{ErrorKind, ServiceName};
use sandmesh_client::TemplateClient;

use crate::error::SchedulerError;

/// The template named `name`. An unknown name is the client's mistake (400), not a missing
/// resource of the call it made; the templates service's own refusal (a malformed name) is
/// passed on as it said it.
pub async fn lookup(templates: &TemplateClient, name: &str) -> Result<Template, SchedulerError> {
    match templates.get(name).await {
        Ok(record) => Ok(record.template),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(SchedulerError::UnknownTemplate {
            name: name.to_string(),
        }),
        Err(e) => Err(SchedulerError::calling(ServiceName::Templates)(e)),
    }
}

/// A template as a run needs it: what the executor picks the image by, and the template's
/// filesystem policy (a session's is added to it at dispatch).
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub run: RunTemplate,
    pub filesystem: Option<FilesystemPolicy>,
}

/// Reads the template `req` names and applies its defaults to `req`. `Ok(None)`: it names
/// none.
pub async fn resolve(
    templates: &TemplateClient,
    req: &mut ExecRequest,
) -> Result<Option<Resolved>, SchedulerError> {
    let Some(name) = req.template.clone() else {
        return Ok(None);
    };
    let template = lookup(templates, &name).await?;
    apply(&template, req);
    Ok(Some(Resolved {
        run: RunTemplate {
            name,
            image: template.image_spec(),
            warm_pool: template.warm_pool,
        },
        filesystem: template.filesystem,
    }))
}

/// What the request leaves out, the template fills in: env variables, each limit, the
/// timeout, the network policy (a session's runs take the session's), bootstrap files.
pub fn apply(template: &Template, req: &mut ExecRequest) {
    for (name, value) in &template.env {
        req.env.entry(name.clone()).or_insert_with(|| value.clone());
    }
    if let Some(defaults) = template.limits {
        let own = req.limits.unwrap_or_default();
        req.limits = Some(Limits {
            memory_mb: own.memory_mb.or(defaults.memory_mb),
            cpus: own.cpus.or(defaults.cpus),
            pids: own.pids.or(defaults.pids),
            max_output_bytes: own.max_output_bytes.or(defaults.max_output_bytes),
        });
    }
    req.timeout_ms = req.timeout_ms.or(template.timeout_ms);
    if req.network.is_none() && req.session_id.is_none() {
        req.network = template.network.clone();
    }
    let bootstrap = template
        .files
        .iter()
        .filter(|f| !req.files.iter().any(|own| own.path == f.path))
        .cloned()
        .collect::<Vec<_>>();
    req.files.splice(0..0, bootstrap);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use messages::exec::{ContentEncoding, FileSpec};

    use super::*;

    fn file(path: &str, content: &str) -> FileSpec {
        FileSpec {
            path: path.into(),
            content: content.into(),
            encoding: ContentEncoding::Utf8,
        }
    }

    #[test]
    fn the_request_wins_and_the_template_fills_the_rest() {
        let template = Template {
            name: "t".into(),
            env: BTreeMap::from([("A".into(), "t".into()), ("B".into(), "t".into())]),
            limits: Some(Limits {
                memory_mb: Some(512),
                pids: Some(99),
                ..Default::default()
            }),
            timeout_ms: Some(60_000),
            files: vec![file("a.py", "template"), file("b.py", "template")],
            ..Default::default()
        };
        let mut req = ExecRequest {
            env: BTreeMap::from([("A".into(), "req".into())]),
            limits: Some(Limits {
                memory_mb: Some(128),
                ..Default::default()
            }),
            files: vec![file("a.py", "request")],
            ..Default::default()
        };
        apply(&template, &mut req);
        assert_eq!(req.env["A"], "req");
        assert_eq!(req.env["B"], "t");
        let limits = req.limits.unwrap();
        assert_eq!((limits.memory_mb, limits.pids), (Some(128), Some(99)));
        assert_eq!(req.timeout_ms, Some(60_000));
        let files: Vec<(&str, &str)> = req
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.content.as_str()))
            .collect();
        assert_eq!(files, [("b.py", "template"), ("a.py", "request")]);
    }

    #[test]
    fn a_session_run_keeps_the_sessions_network() {
        let template = Template {
            network: Some(Default::default()),
            ..Default::default()
        };
        let mut req = ExecRequest {
            session_id: Some("s1".into()),
            ..Default::default()
        };
        apply(&template, &mut req);
        assert!(req.network.is_none());
    }
}
