//! One trace id spans a request across two services: client → front → back, with W3C trace
//! context carried in NATS headers. Its own test binary: it installs the global subscriber.

use std::time::Duration;

use kit::{KitConfig, Runtime, ServiceInfo};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use serde::{Deserialize, Serialize};
use test_support::NatsServer;
use tracing::Instrument;

#[derive(Debug, Serialize, Deserialize)]
struct Ping {
    n: u32,
}

async fn start(url: &str, name: &str) -> Runtime {
    let info = ServiceInfo {
        name: name.into(),
        version: "0.1.0".into(),
        description: name.into(),
    };
    Runtime::start(KitConfig::for_url(url), info).await.unwrap()
}

#[tokio::test]
async fn one_trace_spans_two_services() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let _ = provider.tracer("test");
    kit::telemetry::install(provider.clone(), false);

    let nats = NatsServer::start();
    let back = start(&nats.url(), "back").await;
    back.serve(
        "sandbox.v1.back".into(),
        kit::handler(|_ctx, p: Ping| async move { Ok(Ping { n: p.n + 1 }) }),
    )
    .await
    .unwrap();
    let front = start(&nats.url(), "front").await;
    let mesh = front.mesh().with_timeout(Duration::from_secs(5));
    front
        .serve(
            "sandbox.v1.front".into(),
            kit::handler(move |_ctx, p: Ping| {
                let mesh = mesh.clone();
                async move {
                    mesh.request::<_, Ping>("sandbox.v1.back".into(), &p)
                        .await
                        .map_err(|e| e.into_body())
                }
            }),
        )
        .await
        .unwrap();

    let client = test_support::connect(&nats.url()).await;
    let mesh = kit::mesh_client(client, Default::default()).with_timeout(Duration::from_secs(5));
    let root = tracing::info_span!("client");
    let client_trace = async {
        let reply: Ping = mesh
            .request("sandbox.v1.front".into(), &Ping { n: 1 })
            .await
            .unwrap();
        assert_eq!(reply.n, 2);
        kit::telemetry::current_trace_id().expect("client span has a trace id")
    }
    .instrument(root)
    .await;

    front.shutdown().await;
    back.shutdown().await;
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let server_spans: Vec<_> = spans.iter().filter(|s| s.name == "request").collect();
    assert_eq!(
        server_spans.len(),
        2,
        "one server span per service: {spans:#?}"
    );
    for s in server_spans {
        assert_eq!(s.span_context.trace_id().to_string(), client_trace);
    }
}
