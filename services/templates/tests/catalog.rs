//! The templates service over a real nats-server with the shipped accounts: built-ins present
//! at start, operators write, agents of every tenant read the same templates and cannot write.

use std::time::Duration;

use messages::template::{Template, DEFAULT_TEMPLATE};
use messages::{ServiceName, Subjects};
use sandmesh_client::{ErrorKind, MeshClient};
use test_support::NatsServer;

const WAIT: Duration = Duration::from_secs(30);

async fn mesh_client(url: &str) -> MeshClient {
    MeshClient::new(test_support::connect(url).await, Subjects::default())
        .with_timeout(Duration::from_secs(3))
}

/// Starts the service as its own NATS user; waits until it lists the built-ins.
async fn start(nats: &NatsServer) -> kit::CancellationToken {
    let stop = kit::CancellationToken::new();
    let config = templates::TemplatesConfig::for_url(&nats.service_url(ServiceName::Templates));
    tokio::spawn(templates::run(config, stop.clone()));
    let admin = mesh_client(&nats.url()).await;
    test_support::eventually("the templates service", WAIT, || {
        let admin = admin.clone();
        async move { admin.templates().list().await.ok().filter(|l| l.len() >= 3) }
    })
    .await;
    stop
}

fn template(name: &str) -> Template {
    Template {
        name: name.into(),
        description: "a test template".into(),
        pip_packages: vec!["tabulate==0.9.0".into()],
        ..Default::default()
    }
}

#[tokio::test]
async fn operators_write_and_every_tenants_agents_read_the_same_templates() {
    let nats = NatsServer::start_with_tenants(&["acme", "beta"]);
    let stop = start(&nats).await;
    let operator = mesh_client(&nats.operator_url("operator")).await;
    let acme = mesh_client(&nats.agent_url("acme")).await;
    let beta = mesh_client(&nats.agent_url("beta")).await;

    let names = |l: Vec<messages::template::TemplateRecord>| {
        l.into_iter().map(|r| r.template.name).collect::<Vec<_>>()
    };
    let builtins = ["node-default", "python-data", DEFAULT_TEMPLATE];
    assert_eq!(names(acme.templates().list().await.unwrap()), builtins);
    assert_eq!(names(beta.templates().list().await.unwrap()), builtins);
    let data = beta.templates().get("python-data").await.unwrap();
    assert!(data.builtin);
    assert!(data
        .template
        .debian_packages
        .contains(&"python3-pandas".to_string()));

    // An operator adds one; both tenants see it.
    operator
        .templates()
        .create(&template("tabular"))
        .await
        .unwrap();
    let again = operator.templates().create(&template("tabular")).await;
    assert_eq!(again.unwrap_err().kind(), ErrorKind::Conflict);
    assert_eq!(
        acme.templates().get("tabular").await.unwrap().template,
        template("tabular")
    );

    // Agents cannot write: the server refuses the publish, so nothing reaches the service.
    for refused in [
        acme.templates().create(&template("mine")).await.map(drop),
        acme.templates()
            .update(&template("tabular"))
            .await
            .map(drop),
        beta.templates().delete("python-data").await.map(drop),
    ] {
        assert!(refused.is_err(), "an agent's write went through");
    }
    assert!(beta.templates().get("python-data").await.is_ok());
    let missing = acme.templates().get("mine").await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);

    // Bad input is refused with the field named.
    let bad = Template {
        pip_packages: vec!["--index-url=http://evil.example.org".into()],
        ..template("bad")
    };
    let err = operator.templates().create(&bad).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRequest);
    assert!(err.to_string().contains("pip_packages"), "{err}");

    // An operator's delete works; the built-in comes back at the next start.
    operator.templates().delete("python-data").await.unwrap();
    stop.cancel();
    let stop = start(&nats).await;
    assert!(acme.templates().get("python-data").await.unwrap().builtin);
    stop.cancel();
}

#[tokio::test]
async fn an_operator_updates_a_template_and_every_tenant_reads_the_new_one() {
    let nats = NatsServer::start_with_tenants(&["acme"]);
    let stop = start(&nats).await;
    let operator = mesh_client(&nats.operator_url("operator")).await;
    let acme = mesh_client(&nats.agent_url("acme")).await;
    let created = operator
        .templates()
        .create(&template("tabular"))
        .await
        .unwrap();

    let changed = Template {
        description: "tables, now with plots".into(),
        pip_packages: vec!["tabulate==0.9.0".into(), "plotext==5.3.2".into()],
        ..template("tabular")
    };
    let updated = operator.templates().update(&changed).await.unwrap();
    assert_eq!(updated.template, changed);
    assert_eq!(
        updated.created_at, created.created_at,
        "an update keeps its birth"
    );
    assert!(updated.updated_at >= created.updated_at);
    assert!(!updated.builtin);
    let read = acme.templates().get("tabular").await.unwrap();
    assert_eq!(read, updated, "agents read what the operator wrote");

    // An update is no create, and a bad one changes nothing.
    let unknown = operator.templates().update(&template("ghost")).await;
    let e = unknown.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("use create"), "{e}");
    let bad = Template {
        pip_packages: vec!["-e /etc".into()],
        ..template("tabular")
    };
    let e = operator.templates().update(&bad).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadRequest, "{e}");
    assert_eq!(acme.templates().get("tabular").await.unwrap(), updated);

    // A built-in may be changed too, and stays as the operator made it across a restart.
    let data = acme.templates().get("python-data").await.unwrap();
    let trimmed = Template {
        description: "the operator's own data stack".into(),
        ..data.template.clone()
    };
    operator.templates().update(&trimmed).await.unwrap();
    stop.cancel();
    let stop = start(&nats).await;
    let after = acme.templates().get("python-data").await.unwrap();
    assert_eq!(after.template, trimmed);
    assert!(after.builtin);
    stop.cancel();
}
