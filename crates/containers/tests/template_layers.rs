//! A template image on a sandbox image made by `build.sh` stands on the sandbox's runtime
//! layer with the supervisor copied last: a new supervisor changes the template's last layer
//! only, and Docker's build cache keeps the packages (minutes of downloads and installs).
//! Real Docker; the "sandbox images" here are made by this test, labelled as `build.sh`
//! labels them, from the Debian base `build.sh` makes (so `sandmesh/sandbox:latest` is never
//! replaced by a test image).

use std::process::Command;

use containers::template::{self, BuildBase};
use messages::template::ImageSpec;

const BASE: &str = "sandmesh/debian:bookworm";

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("running docker {args:?}: {e} (these tests use the real Docker daemon)")
        });
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Image tags this test made, removed at its end (also when an assertion fails).
struct Tags(Vec<String>);

impl Drop for Tags {
    fn drop(&mut self) {
        for tag in &self.0 {
            let _ = Command::new("docker").args(["rmi", "-f", tag]).output();
        }
    }
}

/// A "sandbox image": `runtime` plus `binary` as the supervisor, labelled like build.sh's.
fn sandbox_image(tags: &mut Tags, runtime: &str, binary: &str, name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("sandmesh-layers-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(binary, dir.join("sandmesh-supervisor")).unwrap();
    std::fs::write(
        dir.join("Dockerfile"),
        format!("FROM {runtime}\nCOPY sandmesh-supervisor /usr/local/bin/sandmesh-supervisor\n"),
    )
    .unwrap();
    let tag = format!("sandmesh-test/layers-sandbox:{name}-{}", std::process::id());
    tags.0.push(tag.clone());
    let runtime_label = format!("org.sandmesh.runtime={runtime}");
    let supervisor_label = format!("org.sandmesh.supervisor={name}");
    let context = dir.to_string_lossy().to_string();
    let out = Command::new("docker")
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "-q", "-t", &tag, "--label", &runtime_label])
        .args(["--label", &supervisor_label, &context])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tag
}

fn layers(image: &str) -> Vec<String> {
    serde_json::from_str(&docker(&[
        "image",
        "inspect",
        "--format",
        "{{json .RootFS.Layers}}",
        image,
    ]))
    .unwrap()
}

#[test]
fn a_new_supervisor_changes_the_template_image_last_layer_only() {
    assert!(
        !docker(&["image", "ls", "-q", BASE]).is_empty(),
        "{BASE} is missing: build it with deploy/images/build.sh (scripts/test.sh does)"
    );
    let mut tags = Tags(Vec::new());
    let runtime = format!("sandmesh-test/layers-runtime:{}", std::process::id());
    docker(&["tag", BASE, &runtime]);
    tags.0.push(runtime.clone());
    // Two different executables stand in for two builds of the supervisor.
    let first = sandbox_image(&mut tags, &runtime, "/bin/true", "one");
    let second = sandbox_image(&mut tags, &runtime, "/bin/false", "two");
    assert!(matches!(
        BuildBase::of(&first).unwrap(),
        BuildBase::Runtime { runtime: ref r, .. } if *r == runtime
    ));
    // A base without the labels is built on as it is.
    assert_eq!(
        BuildBase::of(&runtime).unwrap(),
        BuildBase::Image(runtime.clone())
    );

    let name = format!("layers-test-{}", std::process::id());
    let spec = ImageSpec {
        debian_packages: vec!["jq".into()],
        ..Default::default()
    };
    let on_first = template::ensure(&name, &spec, &first).unwrap();
    tags.0.push(on_first.clone());
    let on_second = template::ensure(&name, &spec, &second).unwrap();
    tags.0.push(on_second.clone());
    assert_ne!(on_first, on_second, "a new base is a new template image");

    let (a, b) = (layers(&on_first), layers(&on_second));
    assert_eq!(a.len(), b.len());
    let last = a.len() - 1;
    assert_eq!(a[..last], b[..last], "the packages' layers are shared");
    assert_ne!(a[last], b[last], "the supervisor's layer differs");
    // Each carries its own base's supervisor, named by the label the executors check.
    for (image, supervisor, binary) in [
        (&on_first, "one", "/bin/true"),
        (&on_second, "two", "/bin/false"),
    ] {
        let label = docker(&[
            "image",
            "inspect",
            "--format",
            "{{index .Config.Labels \"org.sandmesh.supervisor\"}}",
            image,
        ]);
        assert_eq!(label, supervisor);
        let inside = docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "sha256sum",
            image,
            "/usr/local/bin/sandmesh-supervisor",
        ]);
        let outside = Command::new("sha256sum").arg(binary).output().unwrap();
        assert_eq!(
            inside.split_whitespace().next(),
            String::from_utf8_lossy(&outside.stdout)
                .split_whitespace()
                .next()
        );
    }
}
