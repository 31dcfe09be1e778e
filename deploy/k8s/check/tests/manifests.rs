//! deploy/k8s, validated without a cluster: the base and the `cluster` overlay render, every
//! manifest parses exactly into its k8s-openapi type, every invariant holds, the NATS server
//! configurations are accepted by a real nats-server (`-t`), and each invariant does catch a
//! manifest that breaks it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use sandmesh_k8s_check::render::{self, Rendered};
use sandmesh_k8s_check::{Deployment, Expect, Object, Rule};
use serde_json::{json, Value};

fn k8s_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
fn base() -> PathBuf {
    k8s_dir().join("base")
}
fn cluster() -> PathBuf {
    k8s_dir().join("overlays/cluster")
}
const BASE: Expect = Expect {
    nats_replicas: 1,
    js_replicas: 1,
};
const CLUSTER: Expect = Expect {
    nats_replicas: 3,
    js_replicas: 3,
};

fn load(dir: &Path) -> Deployment {
    Deployment::load(dir).unwrap_or_else(|e| panic!("{}: {e:?}", dir.display()))
}

fn assert_clean(dir: &Path, expect: &Expect) -> Deployment {
    let deployment = load(dir);
    let violations = deployment.violations(expect);
    assert!(
        violations.is_empty(),
        "{}:\n{}",
        dir.display(),
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    deployment
}

fn kinds(d: &Deployment) -> BTreeSet<String> {
    d.objects.iter().map(Object::id).collect()
}

#[test]
fn the_base_holds_every_invariant() {
    let d = assert_clean(&base(), &BASE);
    let ids = kinds(&d);
    for expected in [
        "Namespace/sandmesh",
        "StatefulSet/nats",
        "Service/nats",
        "Service/nats-headless",
        "Deployment/risk-assessor",
        "Deployment/confirmation",
        "Deployment/templates",
        "Deployment/workspace-store",
        "Deployment/scheduler",
        "DaemonSet/docker-executor",
        "NetworkPolicy/default-deny",
    ] {
        assert!(ids.contains(expected), "{expected} missing from {ids:?}");
    }
    let secrets: Vec<&str> = d
        .generated_secrets
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(secrets, ["sandmesh-tenancy", "nats-accounts"]);
}

#[test]
fn the_cluster_overlay_holds_every_invariant_with_three_nats_nodes() {
    let d = assert_clean(&cluster(), &CLUSTER);
    let set = d
        .objects
        .iter()
        .find_map(|o| match o {
            Object::StatefulSet(s) => s.spec.clone(),
            _ => None,
        })
        .expect("a StatefulSet");
    assert_eq!(set.replicas, Some(3));
    assert!(!set.volume_claim_templates.unwrap_or_default().is_empty());
    for object in &d.objects {
        if let Object::Deployment(dep) = object {
            assert_eq!(
                dep.spec.as_ref().and_then(|s| s.replicas),
                Some(2),
                "{}",
                object.id()
            );
        }
        // The overlay's own resources land in the namespace too.
        if !matches!(object, Object::Namespace(_)) {
            let ns = match object {
                Object::PodDisruptionBudget(p) => p.metadata.namespace.clone(),
                Object::Deployment(p) => p.metadata.namespace.clone(),
                Object::StatefulSet(p) => p.metadata.namespace.clone(),
                _ => Some("sandmesh".into()),
            };
            assert_eq!(ns.as_deref(), Some("sandmesh"), "{}", object.id());
        }
    }
    assert!(kinds(&d).contains("PodDisruptionBudget/nats"));
}

/// Every YAML file under base/ and overlays/ is a resource or a patch of a kustomization, so
/// none escapes the checks above.
#[test]
fn every_manifest_file_is_rendered() {
    let mut on_disk = BTreeSet::new();
    for dir in [base(), cluster()] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                on_disk.insert(path.canonicalize().unwrap());
            }
        }
    }
    let mut referenced = BTreeSet::new();
    for dir in [base(), cluster()] {
        let file = dir.join("kustomization.yaml");
        referenced.insert(file.canonicalize().unwrap());
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines() {
            let item = line
                .trim()
                .trim_start_matches("- ")
                .trim_start_matches("path: ");
            let path = dir.join(item);
            if item.ends_with(".yaml") && path.is_file() {
                referenced.insert(path.canonicalize().unwrap());
            }
        }
    }
    let unreferenced: Vec<_> = on_disk.difference(&referenced).collect();
    assert!(unreferenced.is_empty(), "never rendered: {unreferenced:?}");
}

fn nats_server() -> PathBuf {
    let bin = std::env::var_os("SANDMESH_NATS_SERVER").expect(
        "SANDMESH_NATS_SERVER must name a nats-server binary (scripts/install-tools.sh puts one \
         in .tools/bin; scripts/test.sh sets the variable)",
    );
    PathBuf::from(bin)
}

fn nats_conf(rendered: &Rendered) -> String {
    rendered
        .objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "nats-config")
        .and_then(|o| o["data"]["nats.conf"].as_str())
        .expect("ConfigMap nats-config with nats.conf")
        .to_string()
}

/// `nats-server -t` on the rendered configuration, next to the accounts file `sandmesh tenant
/// init` generates (what the `nats-accounts` Secret holds), as the pod sees them.
fn nats_server_accepts(config: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let tenancy = sandmesh_auth::Tenancy::generate(&messages::Subjects::default());
    std::fs::write(dir.path().join("accounts.conf"), tenancy.accounts_config()).unwrap();
    std::fs::write(dir.path().join("nats.conf"), config).unwrap();
    let output = Command::new(nats_server())
        .arg("-t")
        .arg("-c")
        .arg(dir.path().join("nats.conf"))
        .env("POD_NAME", "nats-0")
        .output()
        .expect("running nats-server");
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[test]
fn nats_server_accepts_the_base_and_cluster_configurations() {
    for dir in [base(), cluster()] {
        let config = nats_conf(&render::render(&dir).unwrap());
        if let Err(e) = nats_server_accepts(&config) {
            panic!("{}: nats-server refused the config: {e}", dir.display());
        }
    }
    // And refuses a broken one, so the check above can fail.
    let broken = nats_conf(&render::render(&base()).unwrap())
        .replace("jetstream {", "jetstream {\n  store_dri: /x");
    assert!(nats_server_accepts(&broken).is_err());
}

// === each invariant catches what it is about ===

/// The rules violated once `mutate` has changed the rendered objects of `dir`.
fn rules_after(
    dir: &Path,
    expect: &Expect,
    mutate: impl FnOnce(&mut Vec<Value>),
) -> BTreeSet<String> {
    let mut rendered = render::render(dir).unwrap();
    mutate(&mut rendered.objects);
    let objects: Vec<Object> = rendered
        .objects
        .iter()
        .map(|o| Object::parse(o).unwrap())
        .collect();
    sandmesh_k8s_check::invariants::check(&objects, &rendered.generated_secrets, expect)
        .iter()
        .map(|v| format!("{:?}", v.rule))
        .collect()
}

fn object<'v>(objects: &'v mut [Value], kind: &str, name: &str) -> &'v mut Value {
    objects
        .iter_mut()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind}/{name}"))
}

fn container<'v>(objects: &'v mut [Value], kind: &str, name: &str) -> &'v mut Value {
    &mut object(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]
}

fn assert_caught(rule: Rule, expect: &Expect, dir: &Path, mutate: impl FnOnce(&mut Vec<Value>)) {
    let rules = rules_after(dir, expect, mutate);
    assert_eq!(
        rules,
        BTreeSet::from([format!("{rule:?}")]),
        "expected exactly {rule:?}"
    );
}

#[test]
fn container_hardening_is_enforced() {
    let b = base();
    assert_caught(Rule::WritableRootFilesystem, &BASE, &b, |o| {
        container(o, "Deployment", "scheduler")["securityContext"]["readOnlyRootFilesystem"] =
            json!(false);
    });
    assert_caught(Rule::RunsAsRoot, &BASE, &b, |o| {
        let pod = &mut object(o, "Deployment", "risk-assessor")["spec"]["template"]["spec"];
        pod["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("runAsNonRoot");
        container(o, "Deployment", "risk-assessor")["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("runAsNonRoot");
    });
    assert_caught(Rule::RunsAsRoot, &BASE, &b, |o| {
        container(o, "StatefulSet", "nats")["securityContext"]["runAsUser"] = json!(0);
    });
    assert_caught(Rule::CapabilitiesKept, &BASE, &b, |o| {
        container(o, "Deployment", "confirmation")["securityContext"]["capabilities"] =
            json!({"drop": ["ALL"], "add": ["NET_ADMIN"]});
    });
    assert_caught(Rule::CapabilitiesKept, &BASE, &b, |o| {
        container(o, "DaemonSet", "docker-executor")["securityContext"]["capabilities"]["drop"] =
            json!([]);
    });
    assert_caught(Rule::PrivilegeEscalation, &BASE, &b, |o| {
        container(o, "DaemonSet", "docker-executor")["securityContext"]["privileged"] = json!(true);
    });
    assert_caught(Rule::MissingResources, &BASE, &b, |o| {
        container(o, "Deployment", "workspace-store")["resources"]
            .as_object_mut()
            .unwrap()
            .remove("limits");
    });
    assert_caught(Rule::MissingProbe, &BASE, &b, |o| {
        container(o, "Deployment", "scheduler")
            .as_object_mut()
            .unwrap()
            .remove("livenessProbe");
    });
    assert_caught(Rule::MutableImage, &BASE, &b, |o| {
        container(o, "Deployment", "scheduler")["image"] =
            json!("registry.example:5000/sandmesh/mesh");
    });
    assert_caught(Rule::MutableImage, &BASE, &b, |o| {
        let env = &mut container(o, "DaemonSet", "docker-executor")["env"];
        for var in env.as_array_mut().unwrap() {
            if var["name"] == "SANDMESH_EXEC_IMAGE" {
                var["value"] = json!("sandmesh/sandbox:latest");
            }
        }
    });
    assert_caught(Rule::ServiceAccountToken, &BASE, &b, |o| {
        object(o, "Deployment", "scheduler")["spec"]["template"]["spec"]
            .as_object_mut()
            .unwrap()
            .remove("automountServiceAccountToken");
    });
    assert_caught(Rule::HostNamespace, &BASE, &b, |o| {
        object(o, "DaemonSet", "docker-executor")["spec"]["template"]["spec"]["hostNetwork"] =
            json!(true);
    });
}

#[test]
fn host_paths_are_the_executors_socket_and_egress_directory_only() {
    let b = base();
    let host_volume = json!({"name": "host", "hostPath": {"path": "/etc", "type": "Directory"}});
    assert_caught(Rule::HostPath, &BASE, &b, |o| {
        let pod = &mut object(o, "Deployment", "scheduler")["spec"]["template"]["spec"];
        pod["volumes"]
            .as_array_mut()
            .unwrap()
            .push(host_volume.clone());
    });
    assert_caught(Rule::HostPath, &BASE, &b, |o| {
        let pod = &mut object(o, "DaemonSet", "docker-executor")["spec"]["template"]["spec"];
        pod["volumes"]
            .as_array_mut()
            .unwrap()
            .push(host_volume.clone());
    });
    assert_caught(Rule::ExecutorPlacement, &BASE, &b, |o| {
        object(o, "DaemonSet", "docker-executor")["spec"]["template"]["spec"]
            .as_object_mut()
            .unwrap()
            .remove("nodeSelector");
    });
}

#[test]
fn network_policies_are_enforced() {
    let b = base();
    assert_caught(Rule::NoDefaultDeny, &BASE, &b, |o| {
        o.retain(|o| o["metadata"]["name"] != "default-deny");
    });
    assert_caught(Rule::UnselectedWorkload, &BASE, &b, |o| {
        let policy = object(o, "NetworkPolicy", "services-reach-only-nats");
        let values = &mut policy["spec"]["podSelector"]["matchExpressions"][0]["values"];
        values
            .as_array_mut()
            .unwrap()
            .retain(|v| v != "docker-executor");
    });
    assert_caught(Rule::ReachesBeyondNats, &BASE, &b, |o| {
        let policy = object(o, "NetworkPolicy", "services-reach-only-nats");
        policy["spec"]["egress"]
            .as_array_mut()
            .unwrap()
            .push(json!({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}));
    });
    assert_caught(Rule::ReachesBeyondNats, &BASE, &b, |o| {
        let policy = object(o, "NetworkPolicy", "services-reach-only-nats");
        // NATS's pods, but every port (the cluster routes included).
        policy["spec"]["egress"][0]
            .as_object_mut()
            .unwrap()
            .remove("ports");
    });
    assert_caught(Rule::ReachesBeyondNats, &BASE, &b, |o| {
        let policy = object(o, "NetworkPolicy", "services-reach-only-nats");
        // Every sandmesh pod, not just NATS.
        policy["spec"]["egress"][0]["to"][0]["podSelector"] =
            json!({"matchLabels": {"app.kubernetes.io/part-of": "sandmesh"}});
    });
}

#[test]
fn nats_storage_replicas_and_routes_are_enforced() {
    let c = cluster();
    // Two nodes: the replica count is wrong, and so become the routes (nats-2 is named) and
    // the assets' R3 (more replicas than nodes).
    let rules = rules_after(&c, &CLUSTER, |o| {
        object(o, "StatefulSet", "nats")["spec"]["replicas"] = json!(2);
    });
    let expected = ["JsReplicas", "NatsReplicas", "NatsRoutes"].map(String::from);
    assert_eq!(rules, BTreeSet::from(expected));
    let rules = rules_after(&c, &CLUSTER, |o| {
        object(o, "StatefulSet", "nats")["spec"]
            .as_object_mut()
            .unwrap()
            .remove("volumeClaimTemplates");
        // A pod volume of the same name stands in for the claim, so only storage is wrong.
        let pod = &mut object(o, "StatefulSet", "nats")["spec"]["template"]["spec"];
        pod["volumes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "data", "emptyDir": {}}));
    });
    assert_eq!(rules, BTreeSet::from(["NatsStorage".to_string()]));
    assert_caught(Rule::NatsRoutes, &CLUSTER, &c, |o| {
        let data = &mut object(o, "ConfigMap", "nats-config")["data"]["nats.conf"];
        *data = json!(data
            .as_str()
            .unwrap()
            .replace("nats-route://nats-2.nats-headless:6222", ""));
    });
    assert_caught(Rule::JsReplicas, &CLUSTER, &c, |o| {
        object(o, "ConfigMap", "sandmesh-env")["data"]["SANDMESH_JS_REPLICAS"] = json!("1");
    });
    // R3 on one node: the base with the overlay's replica count.
    assert_caught(Rule::JsReplicas, &BASE, &base(), |o| {
        object(o, "ConfigMap", "sandmesh-env")["data"]["SANDMESH_JS_REPLICAS"] = json!("3");
    });
}

#[test]
fn references_must_resolve() {
    let b = base();
    assert_caught(Rule::DanglingReference, &BASE, &b, |o| {
        let pod = &mut object(o, "Deployment", "scheduler")["spec"]["template"]["spec"];
        pod["volumes"][0]["secret"]["secretName"] = json!("sandmesh-tenancyy");
    });
    assert_caught(Rule::DanglingReference, &BASE, &b, |o| {
        container(o, "Deployment", "scheduler")["envFrom"][0]["configMapRef"]["name"] =
            json!("nope");
    });
    assert_caught(Rule::DanglingReference, &BASE, &b, |o| {
        object(o, "Service", "nats")["spec"]["selector"] =
            json!({"app.kubernetes.io/name": "natz"});
    });
}

#[test]
fn a_patch_that_does_not_apply_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{:?}]\n\
             patches:\n  - path: p.yaml\n    target: {{kind: StatefulSet, name: nats}}\n",
            base().display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        "- op: replace\n  path: /spec/replicaz\n  value: 3\n",
    )
    .unwrap();
    let err = render::render(dir.path()).unwrap_err();
    assert!(matches!(err, render::RenderError::Patch { .. }), "{err:?}");
    // A kustomize feature the renderer does not implement is refused, never ignored.
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ncommonLabels: {a: b}\n",
    )
    .unwrap();
    let err = render::render(dir.path()).unwrap_err();
    assert!(
        matches!(err, render::RenderError::Kustomization { .. }),
        "{err:?}"
    );
}
