//! `POST /v1/browser/page/record`: a screen recording of the current page, upstream's
//! `RecordRequest` (`action` once | start | pause | resume | stop | status, `save_path`,
//! `duration`, `fps`, `quality`).
//!
//! A capture task holds its own CDP connection to the page (page actions go on meanwhile)
//! and runs `Page.startScreencast` with JPEG frames, acknowledging each. Chromium sends a
//! frame when the page repaints, not at a rate, so the file is made at the end: the frames
//! are laid on a grid of `fps` ticks over the recorded time (a frame repeats until the next
//! one arrives; paused time is left out) and written as Motion-JPEG AVI ([`crate::avi`]) to
//! `save_path` in the workspace (default `recordings/record-<ms>.avi`). Upstream writes a
//! video with an encoder this image does not carry; MJPEG needs none.
//!
//! Bounds: `duration` (the recorded time; `start` ends by itself after it and writes the
//! file) at most [`MAX_DURATION`] or the agent's longest timeout, `fps` 1..=30, and
//! [`MAX_FILE_BYTES`] for the frames kept and for the file (more ends the recording early,
//! `truncated: true`). One recording at a time.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use cdp::{CdpError, Page};
use hyper::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::Envelope;
use crate::avi;
use crate::files::{error_chain, FileError, Workspace};
use crate::page::{page, PageError};
use crate::reply::{error, json, Reply};
use crate::Agent;

/// Longest recording (and `once`'s wait).
pub const MAX_DURATION: Duration = Duration::from_secs(300);
/// Frames kept while recording, and the file written, at most.
pub const MAX_FILE_BYTES: usize = 64 << 20;
const MAX_FPS: u32 = 30;
/// Bound of one CDP command of the capture.
const COMMAND_LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordAction {
    #[default]
    Once,
    Start,
    Pause,
    Resume,
    Stop,
    Status,
}

#[derive(Debug, Deserialize)]
pub struct RecordRequest {
    #[serde(default)]
    pub action: RecordAction,
    #[serde(default)]
    pub save_path: Option<String>,
    #[serde(default = "default_duration")]
    pub duration: f64,
    #[serde(default = "default_fps")]
    pub fps: u32,
    #[serde(default = "default_quality")]
    pub quality: u8,
}

fn default_duration() -> f64 {
    10.0
}
fn default_fps() -> u32 {
    15
}
fn default_quality() -> u8 {
    80
}

/// What `record` answers in `data`.
#[derive(Debug, Clone, Serialize)]
pub struct RecordStatus {
    /// `idle`, `recording`, `paused`, `stopped` (the file is written) or `failed`.
    pub status: &'static str,
    pub save_path: Option<String>,
    /// Seconds recorded (pauses left out).
    pub duration: f64,
    /// Frames Chromium sent (the file holds `duration * fps` frames, repeating these).
    pub frames: usize,
    pub file_size_bytes: Option<u64>,
    pub truncated: bool,
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Invalid(String),
    #[error("a recording is already running (stop it first)")]
    Busy,
    #[error("no recording is running")]
    NotRecording,
    #[error(transparent)]
    Page(#[from] PageError),
    #[error("the recording failed: {0}")]
    Failed(String),
}

impl RecordError {
    fn status(&self) -> StatusCode {
        match self {
            RecordError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            RecordError::Busy | RecordError::NotRecording => StatusCode::CONFLICT,
            RecordError::Page(e) => e.status(),
            RecordError::Failed(_) => StatusCode::BAD_GATEWAY,
        }
    }
}

impl From<FileError> for RecordError {
    fn from(e: FileError) -> Self {
        RecordError::Page(e.into())
    }
}

/// What the capture task is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Record,
    Pause,
    Stop,
}

/// The frames so far and the recorded time, shared by the task and `status`.
#[derive(Default)]
struct Frames {
    /// Arrival (recorded time) and the JPEG.
    frames: Vec<(Duration, Bytes)>,
    bytes: usize,
    /// Recorded time before the current stretch, and when the stretch began (none: paused).
    recorded: Duration,
    since: Option<Instant>,
    truncated: bool,
}

impl Frames {
    fn elapsed(&self) -> Duration {
        self.recorded + self.since.map_or(Duration::ZERO, |s| s.elapsed())
    }

    fn pause(&mut self) {
        if let Some(since) = self.since.take() {
            self.recorded += since.elapsed();
        }
    }

    fn resume(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }

    /// Keeps a frame unless paused; false once the byte bound is reached.
    fn push(&mut self, jpeg: Bytes) -> bool {
        if self.since.is_none() {
            return true;
        }
        if self.bytes + jpeg.len() > MAX_FILE_BYTES {
            self.truncated = true;
            return false;
        }
        self.bytes += jpeg.len();
        let at = self.elapsed();
        self.frames.push((at, jpeg));
        true
    }

    /// The frames on a grid of `fps` ticks over the recorded time, within the byte bound.
    fn on_grid(&mut self, fps: u32) -> Vec<Bytes> {
        let ticks = ((self.elapsed().as_secs_f64() * fps as f64).ceil() as usize).max(1);
        let mut out = Vec::with_capacity(ticks);
        let mut size = 0;
        let mut next = 0;
        for tick in 0..ticks {
            let at = Duration::from_secs_f64(tick as f64 / fps as f64);
            while next + 1 < self.frames.len() && self.frames[next + 1].0 <= at {
                next += 1;
            }
            let Some((_, frame)) = self.frames.get(next) else {
                break;
            };
            if size + frame.len() > MAX_FILE_BYTES {
                self.truncated = true;
                break;
            }
            size += frame.len();
            out.push(frame.clone());
        }
        out
    }
}

/// The one recording (running or last finished).
#[derive(Default)]
pub struct Recorder {
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    running: Option<Running>,
    /// The last finished recording's status, for `status` and `stop` after it ended itself.
    last: Option<RecordStatus>,
}

struct Running {
    control: watch::Sender<Control>,
    frames: Arc<Mutex<Frames>>,
    save_path: String,
    /// The task's final status, once it has written the file (or failed).
    result: watch::Receiver<Option<RecordStatus>>,
}

impl Running {
    fn live(&self) -> RecordStatus {
        let frames = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        RecordStatus {
            status: if frames.since.is_some() {
                "recording"
            } else {
                "paused"
            },
            save_path: Some(self.save_path.clone()),
            duration: frames.elapsed().as_secs_f64(),
            frames: frames.frames.len(),
            file_size_bytes: None,
            truncated: frames.truncated,
            error: None,
        }
    }
}

/// Settings of one recording, checked.
struct Settings {
    path: PathBuf,
    duration: Duration,
    fps: u32,
    quality: u8,
}

impl Recorder {
    async fn handle(&self, agent: &Agent, req: RecordRequest) -> Result<RecordStatus, RecordError> {
        let mut state = self.state.lock().await;
        state.reap();
        match req.action {
            RecordAction::Status => Ok(match (&state.running, &state.last) {
                (Some(running), _) => running.live(),
                (None, Some(last)) => last.clone(),
                (None, None) => idle(),
            }),
            RecordAction::Start | RecordAction::Once => {
                if state.running.is_some() {
                    return Err(RecordError::Busy);
                }
                let settings = settings(agent, &req)?;
                let running = start(agent, settings).await?;
                let live = running.live();
                let result = running.result.clone();
                state.running = Some(running);
                if req.action == RecordAction::Start {
                    return Ok(live);
                }
                // `once`: the task ends itself after `duration`; `status` and `stop` are
                // answered meanwhile.
                drop(state);
                let done = outcome(result, live).await;
                self.state.lock().await.reap();
                Ok(done)
            }
            RecordAction::Pause | RecordAction::Resume => {
                let running = state.running.as_ref().ok_or(RecordError::NotRecording)?;
                let control = if req.action == RecordAction::Pause {
                    Control::Pause
                } else {
                    Control::Record
                };
                // The clock first, then the wake-up: the task reads it to know its time left.
                {
                    let mut frames = running.frames.lock().unwrap_or_else(|e| e.into_inner());
                    match control {
                        Control::Pause => frames.pause(),
                        _ => frames.resume(),
                    }
                }
                running.control.send_replace(control);
                Ok(running.live())
            }
            RecordAction::Stop => {
                let Some(running) = state.running.take() else {
                    // Stopping what already ended by itself answers its result.
                    return state.last.clone().ok_or(RecordError::NotRecording);
                };
                running.control.send_replace(Control::Stop);
                let done = outcome(running.result.clone(), running.live()).await;
                state.last = Some(done.clone());
                Ok(done)
            }
        }
    }
}

impl State {
    /// A recording that ended (by itself: its duration, the byte bound) becomes the last.
    fn reap(&mut self) {
        let ended = self
            .running
            .as_ref()
            .and_then(|r| r.result.borrow().clone());
        if let Some(status) = ended {
            self.running = None;
            self.last = Some(status);
        }
    }
}

fn idle() -> RecordStatus {
    RecordStatus {
        status: "idle",
        save_path: None,
        duration: 0.0,
        frames: 0,
        file_size_bytes: None,
        truncated: false,
        error: None,
    }
}

fn settings(agent: &Agent, req: &RecordRequest) -> Result<Settings, RecordError> {
    let longest = MAX_DURATION.min(agent.config.max_timeout);
    if !(req.duration.is_finite() && req.duration > 0.0) {
        return Err(RecordError::Invalid(
            "duration must be a positive number of seconds".into(),
        ));
    }
    let duration = Duration::from_secs_f64(req.duration);
    if duration > longest {
        return Err(RecordError::Invalid(format!(
            "duration must be at most {} s",
            longest.as_secs()
        )));
    }
    if !(1..=MAX_FPS).contains(&req.fps) {
        return Err(RecordError::Invalid(format!("fps must be 1 to {MAX_FPS}")));
    }
    if req.quality > 100 {
        return Err(RecordError::Invalid("quality must be 0 to 100".into()));
    }
    let default_path;
    let requested = match &req.save_path {
        Some(path) => path.as_str(),
        None => {
            let ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            default_path = format!("recordings/record-{ms}.avi");
            &default_path
        }
    };
    Ok(Settings {
        path: agent.workspace.resolve(requested)?,
        duration,
        fps: req.fps,
        quality: req.quality,
    })
}

/// Attaches to the current page, takes a first frame (the screencast sends one only on
/// the next repaint) and starts the capture task.
async fn start(agent: &Agent, settings: Settings) -> Result<Running, RecordError> {
    let target = page(agent).await?.target().to_string();
    let mut page = Page::attach(
        &format!("127.0.0.1:{}", agent.browser.port()),
        &target,
        COMMAND_LIMIT,
    )
    .await
    .map_err(PageError::from)?;
    page.keep_events();
    let first = page
        .call(
            "Page.captureScreenshot",
            json!({"format": "jpeg", "quality": settings.quality}),
        )
        .await
        .map_err(PageError::from)?;
    let frames = Arc::new(Mutex::new(Frames::default()));
    {
        let mut frames = frames.lock().unwrap_or_else(|e| e.into_inner());
        frames.resume();
        if let Some(jpeg) = decode(&first["data"]) {
            frames.push(jpeg);
        }
    }
    page.call(
        "Page.startScreencast",
        json!({"format": "jpeg", "quality": settings.quality, "everyNthFrame": 1}),
    )
    .await
    .map_err(PageError::from)?;
    let (control, commands) = watch::channel(Control::Record);
    let (done, result) = watch::channel(None);
    let save_path = settings.path.display().to_string();
    let capture = record(
        page,
        commands,
        frames.clone(),
        settings,
        agent.workspace.clone(),
    );
    tokio::spawn(async move {
        done.send_replace(Some(capture.await));
    });
    Ok(Running {
        control,
        frames,
        save_path,
        result,
    })
}

fn decode(data: &serde_json::Value) -> Option<Bytes> {
    let text = data.as_str()?;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()
        .map(Bytes::from)
}

/// Waits for the task's final status (`live`: what it had when asked, if the task died).
async fn outcome(
    mut result: watch::Receiver<Option<RecordStatus>>,
    live: RecordStatus,
) -> RecordStatus {
    match result.wait_for(Option::is_some).await {
        Ok(status) => status.clone().expect("waited for it"),
        Err(_) => RecordStatus {
            status: "failed",
            error: Some("the capture task ended without a result".into()),
            ..live
        },
    }
}

/// The capture task: frames until stopped, the duration is recorded, the bound is reached
/// or the page goes away; then the file.
async fn record(
    mut page: Page,
    mut control: watch::Receiver<Control>,
    frames: Arc<Mutex<Frames>>,
    settings: Settings,
    workspace: Workspace,
) -> RecordStatus {
    let lock = || frames.lock().unwrap_or_else(|e| e.into_inner());
    let captured = async {
        loop {
            // Recorded time left; none while paused (a paused recording waits for resume or
            // stop).
            let left = {
                let frames = lock();
                frames
                    .since
                    .map(|_| settings.duration.saturating_sub(frames.elapsed()))
            };
            let time_up = async {
                match left {
                    Some(left) => tokio::time::sleep(left).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = control.changed() => {
                    if changed.is_err() || *control.borrow_and_update() == Control::Stop {
                        break;
                    }
                }
                event = page.next_event() => {
                    let event = event?;
                    if event["method"] != "Page.screencastFrame" {
                        continue;
                    }
                    let params = &event["params"];
                    page.call("Page.screencastFrameAck", json!({"sessionId": params["sessionId"]}))
                        .await?;
                    if let Some(jpeg) = decode(&params["data"]) {
                        if !lock().push(jpeg) {
                            break;
                        }
                    }
                }
                () = time_up => break,
            }
        }
        Ok::<_, CdpError>(())
    };
    let outcome = captured.await;
    page.call("Page.stopScreencast", json!({})).await.ok();
    let mut frames = lock();
    frames.pause();
    let mut status = RecordStatus {
        status: "stopped",
        save_path: Some(settings.path.display().to_string()),
        duration: frames.elapsed().as_secs_f64(),
        frames: frames.frames.len(),
        file_size_bytes: None,
        truncated: false,
        error: None,
    };
    let written = outcome
        .map_err(|e| RecordError::Failed(error_chain(&e)))
        .and_then(|()| write(&mut frames, &settings, &workspace));
    status.truncated = frames.truncated;
    match written {
        Ok(size) => status.file_size_bytes = Some(size),
        Err(e) => {
            status.status = "failed";
            status.error = Some(error_chain(&e));
        }
    }
    status
}

fn write(
    frames: &mut Frames,
    settings: &Settings,
    workspace: &Workspace,
) -> Result<u64, RecordError> {
    let grid = frames.on_grid(settings.fps);
    let Some((width, height)) = grid.first().and_then(|f| avi::jpeg_size(f)) else {
        return Err(RecordError::Failed("no frame arrived from the page".into()));
    };
    let refs: Vec<&[u8]> = grid.iter().map(|f| f.as_ref()).collect();
    let file = avi::mjpeg(&refs, settings.fps, width, height);
    Ok(workspace.write_bytes(&settings.path, &file, false)?)
}

/// `POST /v1/browser/page/record`.
pub async fn handle(agent: &Agent, req: RecordRequest) -> Reply {
    match agent.recorder.handle(agent, req).await {
        Ok(status) => json(StatusCode::OK, &Envelope::ok(status)),
        Err(e) => error(e.status(), error_chain(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn frames_repeat_on_the_grid_and_pauses_are_left_out() {
        let mut frames = Frames::default();
        frames.resume();
        assert!(frames.push(Bytes::from_static(b"a")));
        tokio::time::advance(Duration::from_millis(250)).await;
        frames.push(Bytes::from_static(b"b"));
        tokio::time::advance(Duration::from_millis(250)).await;
        frames.pause();
        frames.push(Bytes::from_static(b"dropped while paused"));
        tokio::time::advance(Duration::from_secs(5)).await;
        frames.resume();
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(frames.elapsed(), Duration::from_secs(1));
        let grid = frames.on_grid(4);
        let grid: Vec<&[u8]> = grid.iter().map(|f| f.as_ref()).collect();
        assert_eq!(grid, [b"a", b"b", b"b", b"b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_byte_bound_ends_the_capture_and_cuts_the_file() {
        let mut frames = Frames::default();
        frames.resume();
        let big = Bytes::from(vec![0u8; MAX_FILE_BYTES / 2 + 1]);
        assert!(frames.push(big.clone()));
        assert!(!frames.push(big));
        assert!(frames.truncated);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(frames.on_grid(10).len(), 1);
    }
}
