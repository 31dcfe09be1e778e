//! The NATS edge: `sandbox.v1.risk.assess` requests decoded with clear errors for bad input
//! (invalid UTF-8, unknown content type or mode → 400, content above the ceiling → 413), then
//! assessed off the async workers. Parsing is CPU work: it runs on the blocking pool, at most
//! one assessment per core at a time, so the NATS read loop and heartbeats never starve.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use messages::exec::FileSpec;
use messages::risk::{AssessRequest, ContentType, RiskAssessment};
use messages::ErrorBody;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use tokio::sync::Semaphore;

use crate::assess::Assessor;
use crate::config::parse_mode;

/// The request as it arrives: strings where the typed request has enums, so an unknown value
/// gets an error that lists the supported ones, and content that may not be UTF-8.
#[derive(Debug, Deserialize)]
pub struct WireAssessRequest {
    content: Content,
    content_type: String,
    #[serde(default)]
    params: Option<serde_json::Value>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    files: Vec<FileSpec>,
}

/// Text, or the offset of its first invalid UTF-8 byte (MessagePack can carry any bytes).
#[derive(Debug)]
pub struct Content(Result<String, usize>);

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Content, E> {
                Ok(Content(Ok(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Content, E> {
                Ok(Content(Ok(v)))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Content, E> {
                Ok(Content(
                    std::str::from_utf8(v)
                        .map(str::to_string)
                        .map_err(|e| e.valid_up_to()),
                ))
            }
        }
        d.deserialize_string(V)
    }
}

pub fn content_type(value: &str) -> Result<ContentType, ErrorBody> {
    match value {
        "python" => Ok(ContentType::Python),
        "javascript" => Ok(ContentType::Javascript),
        "shell" => Ok(ContentType::Shell),
        "browser" => Ok(ContentType::Browser),
        other => Err(ErrorBody::bad_request(format!(
            "unknown content_type {other:?}; supported: {}",
            ContentType::SUPPORTED
        ))),
    }
}

impl WireAssessRequest {
    /// The typed request, or a 400 that says what is wrong.
    pub fn into_request(self) -> Result<AssessRequest, ErrorBody> {
        let content = self.content.0.map_err(|offset| {
            ErrorBody::bad_request(format!(
                "content is not valid UTF-8 (first invalid byte at offset {offset})"
            ))
        })?;
        let content_type = content_type(&self.content_type)?;
        let mode = self
            .mode
            .map(|m| parse_mode(&m).map_err(ErrorBody::bad_request))
            .transpose()?;
        Ok(AssessRequest {
            content,
            content_type,
            params: self.params,
            mode,
            files: self.files,
        })
    }
}

/// Shared by every request of one instance.
pub struct AssessService {
    pub assessor: Arc<Assessor>,
    /// One permit per core: more parallel parses would only queue inside the OS.
    cpu: Semaphore,
    pub in_flight: AtomicU64,
    pub total: AtomicU64,
    /// `sandbox_risk_assessments_total{level,content_type}`.
    metrics: Arc<kit::metrics::Metrics>,
}

impl AssessService {
    pub fn new(assessor: Arc<Assessor>, metrics: Arc<kit::metrics::Metrics>) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self {
            assessor,
            cpu: Semaphore::new(cores),
            in_flight: AtomicU64::new(0),
            total: AtomicU64::new(0),
            metrics,
        }
    }

    pub async fn handle(
        self: Arc<Self>,
        wire: WireAssessRequest,
    ) -> Result<RiskAssessment, ErrorBody> {
        let request = wire.into_request()?;
        // The ceiling is checked before any CPU is spent.
        let max = self.assessor.limits().max_content_bytes;
        if request.content.len() > max {
            return Err(crate::AssessError::TooLarge {
                size: request.content.len(),
                max,
            }
            .into());
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let content_type = request.content_type.as_str();
        let result = async {
            let _permit = self
                .cpu
                .acquire()
                .await
                .map_err(|_| ErrorBody::unavailable("the risk-assessor is stopping"))?;
            let assessor = self.assessor.clone();
            tokio::task::spawn_blocking(move || assessor.assess(&request))
                .await
                .map_err(|e| ErrorBody::internal(format!("assessment failed: {e}")))?
                .map_err(ErrorBody::from)
        }
        .await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        if let Ok(assessment) = &result {
            let labels = kit::metrics::RiskLabels {
                level: assessment.level.as_str(),
                content_type,
            };
            self.metrics.risk_assessments.get_or_create(&labels).inc();
        }
        result
    }
}
