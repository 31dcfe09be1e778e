//! The generated configuration in a real nats-server: every role connects with its own
//! credentials and nobody else's, and the server itself enforces what each may publish.

use std::time::Duration;

use messages::ServiceName;
use test_support::NatsServer;

async fn connect(url: &str) -> Result<async_nats::Client, async_nats::ConnectError> {
    let (options, plain) = test_support::connect_options(url);
    options
        .connection_timeout(Duration::from_secs(5))
        .connect(plain)
        .await
}

#[tokio::test]
async fn every_role_connects_with_its_own_credentials_only() {
    let nats = NatsServer::start_with_tenants(&["acme"]);
    let mut urls = vec![
        nats.url(),
        nats.agent_url("default"),
        nats.agent_url("acme"),
        nats.operator_url("operator"),
    ];
    urls.extend(ServiceName::ALL.iter().map(|s| nats.service_url(*s)));
    for url in &urls {
        connect(url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}\n{}", nats.log()));
    }
    // No credentials, or a wrong password, is refused.
    assert!(connect(&nats.plain_url()).await.is_err());
    let wrong = nats.url().replace("admin:", "admin:x");
    assert!(connect(&wrong).await.is_err());
}
