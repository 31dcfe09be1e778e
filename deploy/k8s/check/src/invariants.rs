//! What every rendering of `deploy/k8s` must satisfy, checked on the typed objects:
//!
//! - every workload container: read-only root filesystem, no privilege escalation, capability
//!   `ALL` dropped and none added, CPU and memory requests and limits, readiness and liveness
//!   probes, an image pinned by tag (never `latest`) or digest; pods mount no service-account
//!   token and share no host namespace;
//! - every workload but the docker-executor DaemonSet runs as non-root; the executor runs only
//!   on nodes labelled for it, and its Docker socket and egress directory are the only
//!   hostPath volumes anywhere;
//! - a default-deny NetworkPolicy exists, every workload is selected by a policy of its own,
//!   and every pod but NATS's may send only to NATS's client port (and the cluster DNS);
//! - NATS is a StatefulSet with the expected replicas, a volume claim template its JetStream
//!   store lives on, a headless Service, and cluster routes naming exactly its pods;
//!   JetStream assets have the expected replica count;
//! - every Secret, ConfigMap and Service selector refers to something that exists.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::objects::Object;
use crate::render::GeneratedSecret;

/// The one workload allowed to run as root and to mount host paths.
pub const EXECUTOR: &str = "docker-executor";
/// The node label the executor's DaemonSet is restricted to.
pub const EXECUTOR_NODE_LABEL: &str = "sandmesh.io/docker-executor";
/// The executor's host paths, with their required hostPath type.
pub const EXECUTOR_HOST_PATHS: [(&str, &str); 2] = [
    ("/var/run/docker.sock", "Socket"),
    ("/var/run/sandmesh-egress", "DirectoryOrCreate"),
];
pub const NATS: &str = "nats";
pub const NATS_CLIENT_PORT: i32 = 4222;
const DNS_PORT: i32 = 53;
const NATS_CONFIG_MAP: &str = "nats-config";
const ENV_CONFIG_MAP: &str = "sandmesh-env";
const JS_REPLICAS: &str = "SANDMESH_JS_REPLICAS";

/// What a rendering is meant to deploy.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub nats_replicas: i32,
    pub js_replicas: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    NoPodSpec,
    RunsAsRoot,
    WritableRootFilesystem,
    PrivilegeEscalation,
    CapabilitiesKept,
    MissingResources,
    MissingProbe,
    MutableImage,
    HostPath,
    HostNamespace,
    ServiceAccountToken,
    ExecutorPlacement,
    NoDefaultDeny,
    UnselectedWorkload,
    ReachesBeyondNats,
    NatsStorage,
    NatsReplicas,
    NatsRoutes,
    JsReplicas,
    DanglingReference,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub object: String,
    pub rule: Rule,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {:?}: {}", self.object, self.rule, self.detail)
    }
}

/// A workload seen through its pod template.
struct Workload<'o> {
    id: String,
    name: &'o str,
    is_executor: bool,
    labels: BTreeMap<String, String>,
    pod: Option<&'o PodSpec>,
}

fn workloads(objects: &[Object]) -> Vec<Workload<'_>> {
    objects
        .iter()
        .filter_map(|object| {
            let template = object.pod_template()?;
            let id = object.id();
            let name = match object {
                Object::Deployment(o) => o.metadata.name.as_deref(),
                Object::DaemonSet(o) => o.metadata.name.as_deref(),
                Object::StatefulSet(o) => o.metadata.name.as_deref(),
                _ => None,
            }
            .unwrap_or_default();
            Some(Workload {
                is_executor: matches!(object, Object::DaemonSet(_)) && name == EXECUTOR,
                id,
                name,
                labels: template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.clone())
                    .unwrap_or_default(),
                pod: template.spec.as_ref(),
            })
        })
        .collect()
}

/// Every violation in `objects`, in a stable order.
pub fn check(objects: &[Object], secrets: &[GeneratedSecret], expect: &Expect) -> Vec<Violation> {
    let mut out = Vec::new();
    let workloads = workloads(objects);
    for w in &workloads {
        check_workload(w, objects, secrets, &mut out);
    }
    check_network_policies(objects, &workloads, &mut out);
    check_nats(objects, expect, &mut out);
    check_services(objects, &workloads, &mut out);
    out
}

fn push(out: &mut Vec<Violation>, object: &str, rule: Rule, detail: impl Into<String>) {
    out.push(Violation {
        object: object.to_string(),
        rule,
        detail: detail.into(),
    });
}

// === workloads ===

fn check_workload(
    w: &Workload<'_>,
    objects: &[Object],
    secrets: &[GeneratedSecret],
    out: &mut Vec<Violation>,
) {
    let Some(pod) = w.pod else {
        return push(out, &w.id, Rule::NoPodSpec, "the pod template has no spec");
    };
    let id = w.id.as_str();
    for (flag, what) in [
        (pod.host_network, "hostNetwork"),
        (pod.host_pid, "hostPID"),
        (pod.host_ipc, "hostIPC"),
    ] {
        if flag == Some(true) {
            push(out, id, Rule::HostNamespace, format!("{what} is on"));
        }
    }
    if pod.automount_service_account_token != Some(false) {
        push(
            out,
            id,
            Rule::ServiceAccountToken,
            "automountServiceAccountToken is not false",
        );
    }
    if w.is_executor {
        let placed = pod
            .node_selector
            .as_ref()
            .and_then(|s| s.get(EXECUTOR_NODE_LABEL))
            .is_some_and(|v| v == "true");
        if !placed {
            push(
                out,
                id,
                Rule::ExecutorPlacement,
                format!("no nodeSelector {EXECUTOR_NODE_LABEL}=true"),
            );
        }
    }
    let pod_context = pod.security_context.as_ref();
    let init = pod.init_containers.iter().flatten();
    for (container, is_init) in pod
        .containers
        .iter()
        .map(|c| (c, false))
        .chain(init.map(|c| (c, true)))
    {
        let at = format!("{id} container {}", container.name);
        let sc = container.security_context.as_ref();
        if !w.is_executor {
            let non_root = sc
                .and_then(|s| s.run_as_non_root)
                .or(pod_context.and_then(|s| s.run_as_non_root));
            let user = sc
                .and_then(|s| s.run_as_user)
                .or(pod_context.and_then(|s| s.run_as_user));
            if non_root != Some(true) || user == Some(0) {
                push(
                    out,
                    &at,
                    Rule::RunsAsRoot,
                    "runAsNonRoot is not true (or runAsUser is 0)",
                );
            }
        }
        if sc.and_then(|s| s.read_only_root_filesystem) != Some(true) {
            push(
                out,
                &at,
                Rule::WritableRootFilesystem,
                "readOnlyRootFilesystem is not true",
            );
        }
        if sc.and_then(|s| s.allow_privilege_escalation) != Some(false)
            || sc.and_then(|s| s.privileged) == Some(true)
        {
            push(
                out,
                &at,
                Rule::PrivilegeEscalation,
                "allowPrivilegeEscalation is not false, or privileged",
            );
        }
        let caps = sc.and_then(|s| s.capabilities.as_ref());
        let drops_all = caps
            .and_then(|c| c.drop.as_ref())
            .is_some_and(|d| d.iter().any(|c| c == "ALL"));
        let adds = caps
            .and_then(|c| c.add.as_ref())
            .is_some_and(|a| !a.is_empty());
        if !drops_all || adds {
            push(
                out,
                &at,
                Rule::CapabilitiesKept,
                "capabilities: drop [ALL] and add none",
            );
        }
        check_resources(container, &at, out);
        if !is_init && (container.readiness_probe.is_none() || container.liveness_probe.is_none()) {
            push(
                out,
                &at,
                Rule::MissingProbe,
                "needs a readinessProbe and a livenessProbe",
            );
        }
        check_images(container, &at, out);
        check_container_references(container, &at, objects, secrets, out);
    }
    for volume in pod.volumes.iter().flatten() {
        if let Some(host) = &volume.host_path {
            let allowed = w.is_executor
                && EXECUTOR_HOST_PATHS
                    .iter()
                    .any(|(path, kind)| host.path == *path && host.type_.as_deref() == Some(kind));
            if !allowed {
                push(
                    out,
                    id,
                    Rule::HostPath,
                    format!("volume {} mounts host path {}", volume.name, host.path),
                );
            }
        }
        let mut secret_names = Vec::new();
        let mut config_maps = Vec::new();
        if let Some(s) = &volume.secret {
            secret_names.extend(s.secret_name.clone());
        }
        if let Some(c) = &volume.config_map {
            config_maps.push(c.name.clone());
        }
        for source in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            secret_names.extend(source.secret.as_ref().map(|s| s.name.clone()));
            config_maps.extend(source.config_map.as_ref().map(|c| c.name.clone()));
        }
        for name in secret_names {
            secret_exists(&name, secrets, id, out);
        }
        for name in config_maps {
            config_map_exists(&name, objects, id, out);
        }
    }
}

fn check_resources(container: &Container, at: &str, out: &mut Vec<Violation>) {
    let r = container.resources.as_ref();
    for (which, set) in [
        ("requests", r.and_then(|r| r.requests.as_ref())),
        ("limits", r.and_then(|r| r.limits.as_ref())),
    ] {
        for resource in ["cpu", "memory"] {
            if !set.is_some_and(|s| s.contains_key(resource)) {
                push(
                    out,
                    at,
                    Rule::MissingResources,
                    format!("no {resource} in {which}"),
                );
            }
        }
    }
}

/// The container's image and the sandbox image it is told to start (`SANDMESH_EXEC_IMAGE`).
fn check_images(container: &Container, at: &str, out: &mut Vec<Violation>) {
    let sandbox = container
        .env
        .iter()
        .flatten()
        .filter(|e| e.name == "SANDMESH_EXEC_IMAGE")
        .map(|e| e.value.clone().unwrap_or_default());
    for image in container.image.clone().into_iter().chain(sandbox) {
        if !pinned(&image) {
            push(
                out,
                at,
                Rule::MutableImage,
                format!("image {image:?} has no tag, or `latest`"),
            );
        }
    }
    if container.image.is_none() {
        push(out, at, Rule::MutableImage, "no image");
    }
}

/// Pinned: a digest, or a tag other than `latest` (the tag follows the last `/`, so a
/// registry's port is not mistaken for one).
pub fn pinned(image: &str) -> bool {
    if image.contains("@sha256:") {
        return true;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((name, tag)) => !name.is_empty() && !tag.is_empty() && tag != "latest",
        None => false,
    }
}

fn check_container_references(
    container: &Container,
    at: &str,
    objects: &[Object],
    secrets: &[GeneratedSecret],
    out: &mut Vec<Violation>,
) {
    for from in container.env_from.iter().flatten() {
        if let Some(s) = &from.secret_ref {
            secret_exists(&s.name, secrets, at, out);
        }
        if let Some(c) = &from.config_map_ref {
            config_map_exists(&c.name, objects, at, out);
        }
    }
    for var in container.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            continue;
        };
        if let Some(s) = &from.secret_key_ref {
            secret_exists(&s.name, secrets, at, out);
        }
        if let Some(c) = &from.config_map_key_ref {
            config_map_exists(&c.name, objects, at, out);
        }
    }
}

fn secret_exists(name: &str, secrets: &[GeneratedSecret], at: &str, out: &mut Vec<Violation>) {
    if !secrets.iter().any(|s| s.name == name) {
        push(
            out,
            at,
            Rule::DanglingReference,
            format!("Secret {name} is not generated"),
        );
    }
}

fn config_map_exists(name: &str, objects: &[Object], at: &str, out: &mut Vec<Violation>) {
    if config_map(objects, name).is_none() {
        push(
            out,
            at,
            Rule::DanglingReference,
            format!("ConfigMap {name} does not exist"),
        );
    }
}

fn config_map<'o>(objects: &'o [Object], name: &str) -> Option<&'o BTreeMap<String, String>> {
    objects.iter().find_map(|o| match o {
        Object::ConfigMap(c) if c.metadata.name.as_deref() == Some(name) => {
            Some(c.data.as_ref().map_or(&EMPTY, |d| d))
        }
        _ => None,
    })
}

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

// === network policies ===

/// Whether `selector` selects a pod labelled `labels` (an empty selector selects every pod).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_match = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_match && expressions_match
}

fn is_empty_selector(s: &LabelSelector) -> bool {
    s.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && s.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

fn covers_both_directions(p: &NetworkPolicy) -> bool {
    let types = p
        .spec
        .as_ref()
        .and_then(|s| s.policy_types.clone())
        .unwrap_or_default();
    types.iter().any(|t| t == "Ingress") && types.iter().any(|t| t == "Egress")
}

fn check_network_policies(
    objects: &[Object],
    workloads: &[Workload<'_>],
    out: &mut Vec<Violation>,
) {
    let policies: Vec<&NetworkPolicy> = objects
        .iter()
        .filter_map(|o| match o {
            Object::NetworkPolicy(p) => Some(p),
            _ => None,
        })
        .collect();
    let is_default_deny = |p: &NetworkPolicy| {
        p.spec.as_ref().is_some_and(|s| {
            s.pod_selector.as_ref().is_none_or(is_empty_selector)
                && s.ingress.as_ref().is_none_or(|r| r.is_empty())
                && s.egress.as_ref().is_none_or(|r| r.is_empty())
        }) && covers_both_directions(p)
    };
    if !policies.iter().any(|p| is_default_deny(p)) {
        push(
            out,
            "NetworkPolicy/*",
            Rule::NoDefaultDeny,
            "no policy denies all ingress and egress by default",
        );
    }
    let nats_labels = workloads.iter().find(|w| w.name == NATS).map(|w| &w.labels);
    for w in workloads {
        let own: Vec<&&NetworkPolicy> = policies
            .iter()
            .filter(|p| !is_default_deny(p) && covers_both_directions(p))
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.pod_selector.as_ref())
                    .is_some_and(|s| !is_empty_selector(s) && selects(s, &w.labels))
            })
            .collect();
        if own.is_empty() {
            push(
                out,
                &w.id,
                Rule::UnselectedWorkload,
                "no NetworkPolicy (Ingress and Egress) selects its pods",
            );
        }
        if w.name == NATS {
            continue;
        }
        for policy in own {
            let name = policy.metadata.name.as_deref().unwrap_or("?");
            for rule in policy
                .spec
                .as_ref()
                .and_then(|s| s.egress.as_ref())
                .into_iter()
                .flatten()
            {
                let peers = rule.to.as_deref().unwrap_or_default();
                let ports = rule.ports.as_deref().unwrap_or_default();
                let to_nats = !peers.is_empty()
                    && peers
                        .iter()
                        .all(|p| is_nats_peer(p, nats_labels, workloads))
                    && only_ports(ports, NATS_CLIENT_PORT);
                let to_dns = !peers.is_empty()
                    && peers.iter().all(is_dns_peer)
                    && only_ports(ports, DNS_PORT);
                if !(to_nats || to_dns) {
                    push(
                        out,
                        &w.id,
                        Rule::ReachesBeyondNats,
                        format!("NetworkPolicy/{name} lets it send elsewhere than NATS's client port and DNS"),
                    );
                }
            }
        }
    }
}

/// A peer in this namespace that selects the NATS pods and no other workload.
fn is_nats_peer(
    peer: &NetworkPolicyPeer,
    nats: Option<&BTreeMap<String, String>>,
    workloads: &[Workload<'_>],
) -> bool {
    let (Some(selector), None, None, Some(nats)) = (
        &peer.pod_selector,
        &peer.namespace_selector,
        &peer.ip_block,
        nats,
    ) else {
        return false;
    };
    selects(selector, nats)
        && workloads
            .iter()
            .filter(|w| w.name != NATS)
            .all(|w| !selects(selector, &w.labels))
}

/// The cluster DNS: pods of kube-system (and nothing by address).
fn is_dns_peer(peer: &NetworkPolicyPeer) -> bool {
    peer.ip_block.is_none()
        && peer.namespace_selector.as_ref().is_some_and(|n| {
            n.match_labels
                .as_ref()
                .and_then(|m| m.get("kubernetes.io/metadata.name"))
                .is_some_and(|ns| ns == "kube-system")
        })
}

/// Non-empty (an empty list means every port) and all the given port.
fn only_ports(ports: &[NetworkPolicyPort], port: i32) -> bool {
    !ports.is_empty()
        && ports
            .iter()
            .all(|p| p.port == Some(IntOrString::Int(port)) && p.end_port.is_none())
}

// === NATS ===

fn check_nats(objects: &[Object], expect: &Expect, out: &mut Vec<Violation>) {
    let id = format!("StatefulSet/{NATS}");
    let Some(set) = objects.iter().find_map(|o| match o {
        Object::StatefulSet(s) if s.metadata.name.as_deref() == Some(NATS) => Some(s),
        _ => None,
    }) else {
        return push(out, &id, Rule::NatsStorage, "no NATS StatefulSet");
    };
    let Some(spec) = &set.spec else {
        return push(out, &id, Rule::NatsStorage, "no spec");
    };
    let replicas = spec.replicas.unwrap_or(1);
    if replicas != expect.nats_replicas {
        push(
            out,
            &id,
            Rule::NatsReplicas,
            format!("{replicas} replicas, expected {}", expect.nats_replicas),
        );
    }
    let headless = objects.iter().any(|o| match o {
        Object::Service(s) => {
            s.metadata.name.as_deref() == spec.service_name.as_deref()
                && s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
        }
        _ => false,
    });
    if !headless {
        push(
            out,
            &id,
            Rule::DanglingReference,
            "serviceName is not a headless Service",
        );
    }
    let claims: Vec<&str> = spec
        .volume_claim_templates
        .iter()
        .flatten()
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    let store = config_map(objects, NATS_CONFIG_MAP)
        .and_then(|d| d.get("nats.conf"))
        .map(String::as_str)
        .unwrap_or_default();
    let store_dir = store
        .lines()
        .find_map(|l| l.trim().strip_prefix("store_dir:"))
        .map(|d| d.trim().trim_matches('"'));
    let on_claim = spec
        .template
        .spec
        .iter()
        .flat_map(|p| &p.containers)
        .any(|c| {
            c.volume_mounts.iter().flatten().any(|m| {
                claims.contains(&m.name.as_str())
                    && store_dir.is_some_and(|d| d.starts_with(m.mount_path.trim_end_matches('/')))
            })
        });
    if claims.is_empty() || !on_claim {
        push(
            out,
            &id,
            Rule::NatsStorage,
            "the JetStream store_dir is not on a volumeClaimTemplate",
        );
    }
    check_routes(
        store,
        replicas,
        spec.service_name.as_deref().unwrap_or_default(),
        out,
    );
    let js = config_map(objects, ENV_CONFIG_MAP).and_then(|d| d.get(JS_REPLICAS));
    match js.map(|v| v.parse::<i32>()) {
        Some(Ok(r)) if r == expect.js_replicas && r <= replicas => {}
        other => push(
            out,
            &format!("ConfigMap/{ENV_CONFIG_MAP}"),
            Rule::JsReplicas,
            format!(
                "{JS_REPLICAS} is {other:?}, expected {} (at most the {replicas} NATS nodes)",
                expect.js_replicas
            ),
        ),
    }
}

/// One node: no cluster block. More: routes to exactly `nats-0 … nats-(n-1)` of the
/// headless Service.
fn check_routes(config: &str, replicas: i32, headless: &str, out: &mut Vec<Violation>) {
    let id = format!("ConfigMap/{NATS_CONFIG_MAP}");
    let routes: Vec<&str> = config
        .split_whitespace()
        .filter(|w| w.starts_with("nats-route://"))
        .collect();
    let expected: Vec<String> = (0..replicas)
        .map(|i| format!("nats-route://{NATS}-{i}.{headless}:6222"))
        .collect();
    let has_cluster = config
        .lines()
        .any(|l| l.trim_start().starts_with("cluster"));
    if replicas == 1 {
        if has_cluster || !routes.is_empty() {
            push(out, &id, Rule::NatsRoutes, "one node but a cluster block");
        }
    } else if !has_cluster || routes != expected {
        push(
            out,
            &id,
            Rule::NatsRoutes,
            format!("routes {routes:?}, expected {expected:?}"),
        );
    }
}

// === services ===

fn check_services(objects: &[Object], workloads: &[Workload<'_>], out: &mut Vec<Violation>) {
    for object in objects {
        let Object::Service(service) = object else {
            continue;
        };
        let selector = service
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        let selected = !selector.is_empty()
            && workloads
                .iter()
                .any(|w| selector.iter().all(|(k, v)| w.labels.get(k) == Some(v)));
        if !selected {
            push(
                out,
                &object.id(),
                Rule::DanglingReference,
                "its selector selects no workload",
            );
        }
    }
}
