//! Rendered manifests as `k8s-openapi` types. A manifest must parse into its kind's type *and*
//! serialise back to exactly what was written: k8s-openapi ignores unknown fields, so without
//! the round trip a misspelt `readOnlyRootFilesytem` would vanish silently (and the API server
//! would drop it just as silently).

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodTemplateSpec, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("{id}: kind {kind} is not one the checker knows (add it to objects.rs)")]
    UnknownKind { id: String, kind: String },
    #[error("{id}: does not parse as {kind}")]
    Type {
        id: String,
        kind: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{id}: fields the {kind} type does not have (misspelt, or the wrong place): {}", fields.join(", "))]
    UnknownFields {
        id: String,
        kind: String,
        fields: Vec<String>,
    },
}

/// Every kind `deploy/k8s` uses.
#[derive(Debug, Clone)]
pub enum Object {
    Namespace(Namespace),
    ConfigMap(ConfigMap),
    Service(Service),
    Deployment(Deployment),
    DaemonSet(DaemonSet),
    StatefulSet(StatefulSet),
    NetworkPolicy(NetworkPolicy),
    PodDisruptionBudget(PodDisruptionBudget),
}

impl Object {
    pub fn parse(value: &Value) -> Result<Object, ParseError> {
        let id = describe(value);
        let kind = value["kind"].as_str().unwrap_or_default();
        Ok(match kind {
            "Namespace" => Object::Namespace(exact(&id, kind, value)?),
            "ConfigMap" => Object::ConfigMap(exact(&id, kind, value)?),
            "Service" => Object::Service(exact(&id, kind, value)?),
            "Deployment" => Object::Deployment(exact(&id, kind, value)?),
            "DaemonSet" => Object::DaemonSet(exact(&id, kind, value)?),
            "StatefulSet" => Object::StatefulSet(exact(&id, kind, value)?),
            "NetworkPolicy" => Object::NetworkPolicy(exact(&id, kind, value)?),
            "PodDisruptionBudget" => Object::PodDisruptionBudget(exact(&id, kind, value)?),
            _ => {
                return Err(ParseError::UnknownKind {
                    id,
                    kind: kind.to_string(),
                })
            }
        })
    }

    /// `Kind/name`, for messages.
    pub fn id(&self) -> String {
        let (kind, name) = match self {
            Object::Namespace(o) => ("Namespace", &o.metadata.name),
            Object::ConfigMap(o) => ("ConfigMap", &o.metadata.name),
            Object::Service(o) => ("Service", &o.metadata.name),
            Object::Deployment(o) => ("Deployment", &o.metadata.name),
            Object::DaemonSet(o) => ("DaemonSet", &o.metadata.name),
            Object::StatefulSet(o) => ("StatefulSet", &o.metadata.name),
            Object::NetworkPolicy(o) => ("NetworkPolicy", &o.metadata.name),
            Object::PodDisruptionBudget(o) => ("PodDisruptionBudget", &o.metadata.name),
        };
        format!("{kind}/{}", name.as_deref().unwrap_or("?"))
    }

    /// The pod template of a workload (Deployment, DaemonSet, StatefulSet).
    pub fn pod_template(&self) -> Option<&PodTemplateSpec> {
        match self {
            Object::Deployment(o) => o.spec.as_ref().map(|s| &s.template),
            Object::DaemonSet(o) => o.spec.as_ref().map(|s| &s.template),
            Object::StatefulSet(o) => o.spec.as_ref().map(|s| &s.template),
            _ => None,
        }
    }
}

fn describe(value: &Value) -> String {
    format!(
        "{}/{}",
        value["kind"].as_str().unwrap_or("?"),
        value["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Parses `value` as `T` and checks that nothing was lost on the way.
fn exact<T: DeserializeOwned + Serialize>(
    id: &str,
    kind: &str,
    value: &Value,
) -> Result<T, ParseError> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|source| ParseError::Type {
        id: id.to_string(),
        kind: kind.to_string(),
        source,
    })?;
    let back = serde_json::to_value(&typed).map_err(|source| ParseError::Type {
        id: id.to_string(),
        kind: kind.to_string(),
        source,
    })?;
    let mut fields = Vec::new();
    lost(value, &back, "", &mut fields);
    if fields.is_empty() {
        Ok(typed)
    } else {
        Err(ParseError::UnknownFields {
            id: id.to_string(),
            kind: kind.to_string(),
            fields,
        })
    }
}

/// The paths of `written` that `typed` (its round trip) does not hold with the same value.
fn lost(written: &Value, typed: &Value, at: &str, out: &mut Vec<String>) {
    match (written, typed) {
        (Value::Object(w), Value::Object(t)) => {
            for (key, value) in w {
                let path = format!("{at}.{key}");
                match t.get(key) {
                    Some(back) => lost(value, back, &path, out),
                    None => out.push(path),
                }
            }
        }
        (Value::Array(w), Value::Array(t)) if w.len() == t.len() => {
            for (i, (value, back)) in w.iter().zip(t).enumerate() {
                lost(value, back, &format!("{at}[{i}]"), out);
            }
        }
        (w, t) if w == t => {}
        // Quantities may be written as numbers (`cpu: 1`); the type keeps them as strings.
        (Value::Number(n), Value::String(s)) if n.to_string() == *s => {}
        _ => out.push(format!("{at} (read as {typed})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(container: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"selector": {"matchLabels": {"a": "b"}},
                     "template": {"metadata": {"labels": {"a": "b"}},
                                  "spec": {"containers": [container]}}}
        })
    }

    #[test]
    fn a_well_formed_object_parses() {
        let value = deployment(json!({"name": "c", "image": "x:1",
            "securityContext": {"readOnlyRootFilesystem": true}}));
        let Object::Deployment(d) = Object::parse(&value).expect("parses") else {
            panic!("not a Deployment")
        };
        let container = &d.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(
            container
                .security_context
                .as_ref()
                .unwrap()
                .read_only_root_filesystem,
            Some(true)
        );
    }

    #[test]
    fn a_misspelt_field_is_an_error_not_a_silent_default() {
        let value = deployment(json!({"name": "c", "image": "x:1",
            "securityContext": {"readOnlyRootFilesytem": true}}));
        match Object::parse(&value) {
            Err(ParseError::UnknownFields { fields, .. }) => assert_eq!(
                fields,
                vec![".spec.template.spec.containers[0].securityContext.readOnlyRootFilesytem"]
            ),
            other => panic!("expected UnknownFields, got {other:?}"),
        }
    }

    #[test]
    fn a_wrongly_typed_value_or_an_unknown_kind_is_an_error() {
        let value = deployment(json!({"name": "c", "ports": {"containerPort": 80}}));
        assert!(matches!(
            Object::parse(&value),
            Err(ParseError::Type { .. })
        ));
        // A number where Kubernetes takes a quantity is fine, as it is for the API server.
        let value = deployment(json!({"name": "c", "resources": {"limits": {"cpu": 1}}}));
        assert!(Object::parse(&value).is_ok());
        let value = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
        assert!(matches!(
            Object::parse(&value),
            Err(ParseError::UnknownKind { .. })
        ));
        let mut value = deployment(json!({"name": "c"}));
        value["apiVersion"] = json!("apps/v1beta1");
        assert!(matches!(
            Object::parse(&value),
            Err(ParseError::Type { .. })
        ));
    }
}
