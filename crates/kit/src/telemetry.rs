//! Tracing for every service: `tracing` logs, OpenTelemetry spans (exported over OTLP when an
//! endpoint is configured) and W3C trace context carried in NATS headers on every hop.
//!
//! Spans exist even when nothing is exported, so trace ids still cross services and land in
//! audit events.

use std::io::IsTerminal;

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

/// Writes the current span's context (`traceparent`, `tracestate`) into outgoing headers.
pub fn inject_current(headers: &mut HeaderMap) {
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
}

/// Makes `span` a child of the context carried in incoming headers. Call before entering it.
pub fn set_parent_from(span: &tracing::Span, headers: Option<&HeaderMap>) {
    if let Some(headers) = headers {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        if parent.span().span_context().is_valid() {
            let _ = span.set_parent(parent);
        }
    }
}

/// The trace id of the current span, as 32 hex digits, when there is one.
pub fn current_trace_id() -> Option<String> {
    let cx = tracing::Span::current().context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// Keeps the tracer provider alive; flushes pending spans when dropped.
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Installs the global subscriber: env-filtered logs (`RUST_LOG`, default info), plain (coloured
/// on a terminal) or JSON, plus OpenTelemetry spans exported to `otlp_endpoint` when given.
pub fn init(service: &str, otlp_endpoint: Option<&str>, json: bool) -> TelemetryGuard {
    let mut builder = SdkTracerProvider::builder();
    if let Some(endpoint) = otlp_endpoint {
        use opentelemetry_otlp::WithExportConfig;
        match opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
        {
            Ok(exporter) => builder = builder.with_batch_exporter(exporter),
            Err(e) => eprintln!("OTLP export disabled: {e}"),
        }
    }
    let provider = builder
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_string())
                .build(),
        )
        .build();
    install(provider.clone(), json);
    TelemetryGuard { provider }
}

/// Installs the global subscriber with a given provider (tests use an in-memory exporter).
/// Does nothing when a global subscriber is already set.
pub fn install(provider: SdkTracerProvider, json: bool) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,async_nats=warn"));
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("sandmesh"));
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    let _ = if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init()
    } else {
        // Colour codes only for a person at a terminal, never into a log file or a pipe.
        let ansi = std::io::stderr().is_terminal();
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(std::io::stderr),
            )
            .try_init()
    };
}
