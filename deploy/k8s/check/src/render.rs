//! Renders a kustomization directory the way `kustomize build` does, for the subset
//! `deploy/k8s` uses: `resources` (files and other kustomization directories), `namespace`,
//! `patches` with JSON 6902 operations targeted by kind and optional name, and
//! `secretGenerator` (recorded by name, not read: its files are credentials that are never
//! committed). Anything else in a kustomization is an error, never silently ignored, so a
//! manifest the checker passes is the manifest kustomize would produce.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not valid YAML", path.display())]
    Yaml {
        path: PathBuf,
        #[source]
        source: serde_norway::Error,
    },
    #[error("{}: not a kustomization this checker renders", path.display())]
    Kustomization {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: document {index} is not a Kubernetes object (no apiVersion/kind/metadata.name)", path.display())]
    NotAnObject { path: PathBuf, index: usize },
    #[error("{}: the patch is not a list of JSON 6902 operations", path.display())]
    PatchFormat {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// `detail`: the operation, its target and why it failed.
    #[error("{}: operation {index}: {detail}", path.display())]
    Patch {
        path: PathBuf,
        index: usize,
        detail: String,
    },
    #[error("{}: the patch's target {kind}/{name} matches no resource", path.display())]
    PatchTargetMissing {
        path: PathBuf,
        kind: String,
        name: String,
    },
    #[error("{}: {file:?} leaves the kustomization directory", path.display())]
    OutsideRoot { path: PathBuf, file: String },
}

/// What `kustomize build` would print: the objects, plus the Secrets its generators make.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    pub objects: Vec<Value>,
    pub generated_secrets: Vec<GeneratedSecret>,
}

/// A Secret from a `secretGenerator`: its name (kustomize appends a content hash and rewrites
/// every reference to it, so references use this name) and its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedSecret {
    pub name: String,
    pub namespace: Option<String>,
    pub keys: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    patches: Vec<PatchRef>,
    #[serde(default)]
    secret_generator: Vec<SecretGeneratorSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchRef {
    path: String,
    target: PatchTarget,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchTarget {
    kind: String,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretGeneratorSpec {
    name: String,
    files: Vec<String>,
}

/// One JSON 6902 operation (RFC 6902); `add`, `remove` and `replace` are the ones supported.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "op", rename_all = "lowercase")]
enum Operation {
    Add { path: String, value: Value },
    Remove { path: String },
    Replace { path: String, value: Value },
}

impl Operation {
    fn describe(&self) -> (&'static str, &str) {
        match self {
            Operation::Add { path, .. } => ("add", path),
            Operation::Remove { path } => ("remove", path),
            Operation::Replace { path, .. } => ("replace", path),
        }
    }
}

/// Renders the kustomization in `dir` (its `kustomization.yaml`).
pub fn render(dir: &Path) -> Result<Rendered, RenderError> {
    let file = dir.join("kustomization.yaml");
    let spec: Kustomization =
        serde_json::from_value(read_one(&file)?).map_err(|source| RenderError::Kustomization {
            path: file.clone(),
            source,
        })?;
    let mut out = Rendered::default();
    for resource in &spec.resources {
        let path = dir.join(resource);
        if path.is_dir() {
            let inner = render(&path)?;
            out.objects.extend(inner.objects);
            out.generated_secrets.extend(inner.generated_secrets);
        } else {
            out.objects.extend(read_objects(&path)?);
        }
    }
    for generator in &spec.secret_generator {
        let mut keys = Vec::new();
        for entry in &generator.files {
            // `key=path` or just `path` (the key is then the file's name).
            let (key, source) = entry.split_once('=').unwrap_or_else(|| {
                let name = entry.rsplit('/').next().unwrap_or(entry);
                (name, entry.as_str())
            });
            if Path::new(source).is_absolute() || source.split('/').any(|c| c == "..") {
                return Err(RenderError::OutsideRoot {
                    path: file.clone(),
                    file: source.to_string(),
                });
            }
            keys.push(key.to_string());
        }
        out.generated_secrets.push(GeneratedSecret {
            name: generator.name.clone(),
            namespace: None,
            keys,
        });
    }
    for patch in &spec.patches {
        apply_patch(&dir.join(&patch.path), &patch.target, &mut out.objects)?;
    }
    if let Some(namespace) = &spec.namespace {
        for object in &mut out.objects {
            // Namespaces themselves are cluster-scoped.
            if object["kind"] != "Namespace" {
                object["metadata"]["namespace"] = Value::String(namespace.clone());
            }
        }
        for secret in &mut out.generated_secrets {
            secret.namespace = Some(namespace.clone());
        }
    }
    Ok(out)
}

fn read(path: &Path) -> Result<String, RenderError> {
    std::fs::read_to_string(path).map_err(|source| RenderError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Every YAML document of a file, empty ones (comments only) skipped.
fn read_documents(path: &Path) -> Result<Vec<Value>, RenderError> {
    let text = read(path)?;
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(&text) {
        let value = Value::deserialize(document).map_err(|source| RenderError::Yaml {
            path: path.to_path_buf(),
            source,
        })?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

fn read_one(path: &Path) -> Result<Value, RenderError> {
    Ok(read_documents(path)?
        .into_iter()
        .next()
        .unwrap_or(Value::Null))
}

fn read_objects(path: &Path) -> Result<Vec<Value>, RenderError> {
    let documents = read_documents(path)?;
    for (index, document) in documents.iter().enumerate() {
        let named = document["metadata"]["name"].is_string();
        if !(document["apiVersion"].is_string() && document["kind"].is_string() && named) {
            return Err(RenderError::NotAnObject {
                path: path.to_path_buf(),
                index,
            });
        }
    }
    Ok(documents)
}

fn apply_patch(
    path: &Path,
    target: &PatchTarget,
    objects: &mut [Value],
) -> Result<(), RenderError> {
    let operations: Vec<Operation> =
        serde_json::from_value(read_one(path)?).map_err(|source| RenderError::PatchFormat {
            path: path.to_path_buf(),
            source,
        })?;
    let mut matched = false;
    for object in objects.iter_mut() {
        let kind_matches = object["kind"] == target.kind.as_str();
        let name_matches = target
            .name
            .as_ref()
            .is_none_or(|name| object["metadata"]["name"] == name.as_str());
        if !(kind_matches && name_matches) {
            continue;
        }
        matched = true;
        let described = format!("{}/{}", target.kind, object["metadata"]["name"]);
        for (index, operation) in operations.iter().enumerate() {
            apply_operation(object, operation).map_err(|reason| {
                let (op, pointer) = operation.describe();
                RenderError::Patch {
                    path: path.to_path_buf(),
                    index,
                    detail: format!("{op} {pointer} on {described}: {reason}"),
                }
            })?;
        }
    }
    if matched {
        Ok(())
    } else {
        Err(RenderError::PatchTargetMissing {
            path: path.to_path_buf(),
            kind: target.kind.clone(),
            name: target.name.clone().unwrap_or_else(|| "*".into()),
        })
    }
}

/// Applies one operation with RFC 6902 semantics: the parent must exist; `replace` and
/// `remove` need an existing member; `add` creates or overwrites a member, or inserts into an
/// array (`-` appends).
fn apply_operation(document: &mut Value, operation: &Operation) -> Result<(), String> {
    let (_, pointer) = operation.describe();
    let tokens = parse_pointer(pointer)?;
    let Some((last, parents)) = tokens.split_last() else {
        return Err("the whole document cannot be patched".into());
    };
    let mut parent = &mut *document;
    for token in parents {
        parent = child(parent, token)?;
    }
    match (operation, parent) {
        (Operation::Add { value, .. }, Value::Object(map)) => {
            map.insert(last.clone(), value.clone());
        }
        (Operation::Replace { value, .. }, Value::Object(map)) => {
            let slot = map
                .get_mut(last)
                .ok_or(format!("no member {last:?} to replace"))?;
            *slot = value.clone();
        }
        (Operation::Remove { .. }, Value::Object(map)) => {
            map.remove(last)
                .ok_or(format!("no member {last:?} to remove"))?;
        }
        (Operation::Add { value, .. }, Value::Array(items)) => {
            let at = if last == "-" {
                items.len()
            } else {
                array_index(last, items.len() + 1)?
            };
            items.insert(at, value.clone());
        }
        (Operation::Replace { value, .. }, Value::Array(items)) => {
            let at = array_index(last, items.len())?;
            items[at] = value.clone();
        }
        (Operation::Remove { .. }, Value::Array(items)) => {
            let at = array_index(last, items.len())?;
            items.remove(at);
        }
        (_, other) => {
            return Err(format!(
                "the parent is a {}, not an object or array",
                kind_of(other)
            ))
        }
    }
    Ok(())
}

fn child<'v>(value: &'v mut Value, token: &str) -> Result<&'v mut Value, String> {
    match value {
        Value::Object(map) => map.get_mut(token).ok_or(format!("no member {token:?}")),
        Value::Array(items) => {
            let len = items.len();
            Ok(&mut items[array_index(token, len)?])
        }
        other => Err(format!("{token:?} is inside a {}", kind_of(other))),
    }
}

fn array_index(token: &str, len: usize) -> Result<usize, String> {
    // RFC 6901: no leading zeros, no sign.
    let well_formed =
        token == "0" || (!token.starts_with('0') && token.bytes().all(|b| b.is_ascii_digit()));
    match token.parse::<usize>() {
        Ok(i) if well_formed && i < len => Ok(i),
        _ => Err(format!("{token:?} is not an index below {len}")),
    }
}

fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!(
            "{pointer:?} is not a JSON pointer (it must start with /)"
        ));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::new();
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                match (c, c == '~') {
                    (_, false) => out.push(c),
                    (_, true) => match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(format!("{token:?}: `~` must be followed by 0 or 1")),
                    },
                }
            }
            Ok(out)
        })
        .collect()
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply(document: &mut Value, operation: Value) -> Result<(), String> {
        let operation: Operation = serde_json::from_value(operation).expect("an operation");
        apply_operation(document, &operation)
    }

    #[test]
    fn operations_follow_rfc_6902() {
        let mut d = json!({"spec": {"replicas": 1, "list": [1, 2]}, "a/b": {"~c": 0}});
        apply(
            &mut d,
            json!({"op": "replace", "path": "/spec/replicas", "value": 3}),
        )
        .unwrap();
        apply(
            &mut d,
            json!({"op": "add", "path": "/spec/list/-", "value": 4}),
        )
        .unwrap();
        apply(
            &mut d,
            json!({"op": "add", "path": "/spec/list/0", "value": 0}),
        )
        .unwrap();
        apply(&mut d, json!({"op": "remove", "path": "/spec/list/1"})).unwrap();
        apply(
            &mut d,
            json!({"op": "replace", "path": "/a~1b/~0c", "value": 1}),
        )
        .unwrap();
        apply(
            &mut d,
            json!({"op": "add", "path": "/spec/new", "value": {"x": true}}),
        )
        .unwrap();
        assert_eq!(
            d,
            json!({"spec": {"replicas": 3, "list": [0, 2, 4], "new": {"x": true}}, "a/b": {"~c": 1}})
        );
    }

    #[test]
    fn operations_on_missing_or_malformed_paths_are_errors() {
        let mut d = json!({"spec": {"list": [1]}});
        let bad = [
            json!({"op": "replace", "path": "/spec/absent", "value": 1}),
            json!({"op": "remove", "path": "/spec/absent"}),
            json!({"op": "add", "path": "/absent/deeper", "value": 1}),
            json!({"op": "replace", "path": "/spec/list/1", "value": 1}),
            json!({"op": "replace", "path": "/spec/list/01", "value": 1}),
            json!({"op": "replace", "path": "/spec/list/-1", "value": 1}),
            json!({"op": "add", "path": "spec", "value": 1}),
            json!({"op": "add", "path": "/spec/~2", "value": 1}),
            json!({"op": "add", "path": "", "value": 1}),
            json!({"op": "add", "path": "/spec/list/0/x", "value": 1}),
        ];
        for operation in bad {
            let before = d.clone();
            assert!(
                apply(&mut d, operation.clone()).is_err(),
                "{operation} applied"
            );
            assert_eq!(d, before, "{operation} changed the document");
        }
    }

    #[test]
    fn unsupported_operations_do_not_parse() {
        for op in ["move", "copy", "test", "merge"] {
            let parsed = serde_json::from_value::<Operation>(
                json!({"op": op, "path": "/a", "from": "/b", "value": 1}),
            );
            assert!(parsed.is_err(), "{op} parsed");
        }
    }
}
