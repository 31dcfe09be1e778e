//! Templates end to end: the real templates service, scheduler, risk-assessor and
//! docker-executor over a real nats-server and the real Docker daemon. A template's image is
//! built on its first use (content-addressed: a later run, or another test binary, finds it),
//! its packages installed at build time, so code imports them in a sandbox without network.

use sandmesh_client::ClientError;
use std::net::SocketAddr;
use std::time::Duration;

use crate::common::{eventually, Mesh};
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, TierChoice};
use messages::session::{SessionOpen, SessionRecord};
use messages::subjects::SessionOp;
use messages::template::Template;
use messages::{ErrorKind, Subjects};
use sandmesh_client::metrics::scrape;
use sandmesh_client::MeshClient;

fn in_template(template: &str, code: &str) -> ExecRequest {
    ExecRequest {
        language: Language::Python,
        code: code.into(),
        template: Some(template.into()),
        ..Default::default()
    }
}

/// Long enough for a first run that waits for its template's image to be built.
const BUILD_WAIT: Duration = Duration::from_secs(900);

async fn exec(mesh: &Mesh, r: &ExecRequest) -> ExecResult {
    let result: ExecResult = mesh
        .client
        .request_timeout(Subjects::default().exec(), r, BUILD_WAIT)
        .await
        .unwrap_or_else(|e| panic!("exec {r:?}: {e}"));
    assert_eq!(result.status, ExecStatus::Ok, "{result:#?}");
    result
}

/// A small pure-Python package from the PyPI index this machine's pip reaches.
fn tabular() -> Template {
    Template {
        name: "tabular".into(),
        description: "tabulate from PyPI, installed at build time".into(),
        pip_packages: vec!["tabulate==0.9.0".into()],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn templates_run_in_their_own_images_without_network_and_warm_from_the_second_run() {
    let addr = SocketAddr::from(([127, 0, 0, 1], test_support::free_port()));
    let mesh = Mesh::builder()
        .metrics(addr)
        .real_risk()
        .confirm(&[])
        .real_workspace()
        .templates()
        .docker_executors(1)
        .scheduler(|_| {})
        .start()
        .await;
    let admin = MeshClient::new(test_support::connect(&mesh.url).await, Subjects::default());
    eventually("the templates service", || {
        let admin = admin.clone();
        async move { admin.templates().create(&tabular()).await.ok() }
    })
    .await;

    let data = "import numpy, pandas; print(numpy.arange(3).sum())";
    let tabulate = "import tabulate\nprint(tabulate.tabulate([[1, 2]], tablefmt='plain'))";
    for round in 0..2 {
        let r = exec(&mesh, &in_template("python-data", data)).await;
        assert_eq!(r.stdout, "3\n");
        let ran = r.template.expect("the result names its template");
        assert_eq!(ran.name, "python-data");
        assert!(
            ran.image.starts_with("sandmesh/template-python-data:"),
            "{ran:?}"
        );

        // No network policy: the container has no network at all, and needs none.
        let r = exec(&mesh, &in_template("tabular", tabulate)).await;
        assert_eq!(r.stdout, "1  2\n");
        assert!(r.network.is_none());
        assert!(r
            .template
            .unwrap()
            .image
            .starts_with("sandmesh/template-tabular:"));

        if round == 0 {
            // Each template in use now has warm stock of its own.
            eventually("a warm container of each template", || async move {
                let s = scrape(addr).await.ok()?;
                let size = |t| s.sum("sandbox_template_warm_pool_size", &[("template", t)]);
                (size("python-data") >= 1.0 && size("tabular") >= 1.0).then_some(())
            })
            .await;
        }
    }
    let s = scrape(addr).await.unwrap();
    for template in ["python-data", "tabular"] {
        let labels = [("template", template)];
        assert_eq!(
            s.sum("sandbox_warm_pool_misses_total", &labels),
            1.0,
            "{template}: only its first run starts a container cold"
        );
        assert_eq!(
            s.sum("sandbox_warm_pool_hits_total", &labels),
            1.0,
            "{template}: its second run is served warm"
        );
    }
    // A session opened in a template runs every execution there, in its own container.
    let open = SessionOpen {
        session_id: Some("analysis".into()),
        template: Some("python-data".into()),
        ..Default::default()
    };
    let subject = Subjects::default().sessions(SessionOp::Open);
    let record: SessionRecord = mesh.client.request(subject, &open).await.unwrap();
    assert_eq!(record.template.as_deref(), Some("python-data"));
    let in_session = ExecRequest {
        session_id: Some("analysis".into()),
        tier: TierChoice::Session,
        ..in_template(
            "python-data",
            "import pandas; print(pandas.DataFrame({'a': [1, 2]}).a.sum())",
        )
    };
    let r = exec(
        &mesh,
        &ExecRequest {
            template: None,
            ..in_session
        },
    )
    .await;
    assert_eq!(r.stdout, "3\n");
    assert_eq!(r.template.unwrap().name, "python-data");

    // The built-in that adds nothing runs in the node's own image and pool.
    let r = exec(&mesh, &in_template("python-default", "print(1)")).await;
    assert_eq!(r.template.unwrap().name, "python-default");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_template_is_a_clear_bad_request() {
    let mesh = Mesh::builder()
        .risk()
        .templates()
        .executor("a", 1)
        .scheduler(|_| {})
        .start()
        .await;
    let err = eventually("the templates service", || async {
        match mesh.exec(&in_template("no-such", "print(1)")).await {
            Err(ClientError::Service { body, .. }) if body.kind == ErrorKind::BadRequest => {
                Some(body)
            }
            _ => None,
        }
    })
    .await;
    assert!(
        err.message.contains("unknown template \"no-such\""),
        "{err:?}"
    );
    // A session is opened in a template that exists, or not at all.
    let open = SessionOpen {
        session_id: Some("s1".into()),
        template: Some("no-such".into()),
        ..Default::default()
    };
    let subject = Subjects::default().sessions(SessionOp::Open);
    let refused = mesh
        .client
        .request::<_, SessionRecord>(subject, &open)
        .await;
    assert!(
        matches!(&refused, Err(ClientError::Service { body: b, .. }) if b.kind == ErrorKind::BadRequest),
        "{refused:?}"
    );
    assert!(mesh.runs.lock().unwrap().is_empty(), "nothing ran");
}
