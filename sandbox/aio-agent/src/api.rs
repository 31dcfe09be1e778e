//! The AIO sandbox API shapes this agent speaks (`reference/aio-sandbox-openapi.json`,
//! spec 1.9.4): request bodies as the spec names them, responses in its envelope
//! `{success, message, data, hint}`. Fields the agent does not implement are accepted and
//! ignored, so clients of the upstream image keep working.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// An id this agent hands out (a shell, command, kernel session or message id): `prefix-N`,
/// unique within the process.
pub(crate) fn next_id(prefix: &str) -> String {
    format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

/// `Response[T]`: every JSON answer except `GET /v1/sandbox` and `/json/version`.
#[derive(Debug, Serialize)]
pub struct Envelope<T> {
    pub success: bool,
    pub message: String,
    pub data: Option<T>,
    pub hint: Option<String>,
}

impl<T> Envelope<T> {
    pub fn ok(data: T) -> Self {
        Self {
            success: true,
            message: "Operation successful".into(),
            data: Some(data),
            hint: None,
        }
    }
}

impl Envelope<()> {
    pub fn error(message: String) -> Self {
        Self {
            success: false,
            message,
            data: None,
            hint: None,
        }
    }
}

/// `ShellExecRequest` (`POST /v1/shell/exec`).
#[derive(Debug, Deserialize)]
pub struct ShellExecRequest {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub exec_dir: Option<String>,
    pub command: String,
    /// Seconds. Upstream only ends the HTTP wait here; this agent has no background commands,
    /// so it bounds the command itself, like `hard_timeout`.
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub hard_timeout: Option<f64>,
    #[serde(default = "yes")]
    pub truncate: bool,
}

fn yes() -> bool {
    true
}

/// `BashExecRequest` (`POST /v1/bash/exec`).
#[derive(Debug, Deserialize)]
pub struct BashExecRequest {
    #[serde(default)]
    pub session_id: Option<String>,
    pub command: String,
    #[serde(default)]
    pub exec_dir: Option<String>,
    #[serde(default)]
    pub env: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub hard_timeout: Option<f64>,
    #[serde(default = "default_max_output")]
    pub max_output_length: usize,
}

fn default_max_output() -> usize {
    50_000
}

/// `ConsoleRecord`.
#[derive(Debug, Serialize)]
pub struct ConsoleRecord {
    pub ps1: String,
    pub command: String,
    pub output: String,
}

/// `ShellCommandResult`; `status` is a `BashCommandStatus`.
#[derive(Debug, Serialize)]
pub struct ShellCommandResult {
    pub session_id: String,
    pub command: String,
    pub status: &'static str,
    pub output: String,
    pub console: Vec<ConsoleRecord>,
    pub exit_code: Option<i32>,
}

/// `BashExecResult`; `status` is a `CommandStatus`.
#[derive(Debug, Serialize)]
pub struct BashExecResult {
    pub session_id: String,
    pub command_id: String,
    pub command: String,
    pub status: &'static str,
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
    pub offset: usize,
    pub stderr_offset: usize,
}

#[derive(Debug, Deserialize)]
pub struct FileReadRequest {
    pub file: String,
    #[serde(default)]
    pub start_line: Option<usize>,
    #[serde(default)]
    pub end_line: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct FileReadResult {
    pub content: String,
    pub file: String,
}

#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy, Default)]
pub enum FileContentEncoding {
    #[default]
    #[serde(rename = "utf-8")]
    Utf8,
    #[serde(rename = "base64")]
    Base64,
    #[serde(rename = "raw")]
    Raw,
}

#[derive(Debug, Deserialize)]
pub struct FileWriteRequest {
    pub file: String,
    pub content: String,
    #[serde(default)]
    pub encoding: Option<FileContentEncoding>,
    #[serde(default)]
    pub append: Option<bool>,
    #[serde(default)]
    pub leading_newline: Option<bool>,
    #[serde(default)]
    pub trailing_newline: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct FileWriteResult {
    pub file: String,
    pub bytes_written: u64,
}

#[derive(Debug, Deserialize)]
pub struct FileListRequest {
    pub path: String,
    #[serde(default)]
    pub recursive: Option<bool>,
    #[serde(default)]
    pub show_hidden: Option<bool>,
    #[serde(default)]
    pub max_depth: Option<usize>,
}

/// `FileInfo`.
#[derive(Debug, Serialize)]
pub struct FileInfo {
    pub name: String,
    pub path: String,
    pub is_directory: bool,
    pub size: Option<u64>,
    pub modified_time: Option<String>,
    pub permissions: Option<String>,
    pub extension: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct FileListResult {
    pub path: String,
    pub files: Vec<FileInfo>,
    pub total_count: usize,
    pub directory_count: usize,
    pub file_count: usize,
}

#[derive(Debug, Serialize)]
pub struct FileUploadResult {
    pub file_path: String,
    pub file_size: u64,
    pub success: bool,
}

#[derive(Debug, Serialize)]
pub struct BrowserViewport {
    pub width: u32,
    pub height: u32,
}

/// `BrowserInfoResult`. There is no VNC here; `vnc_url` is empty.
#[derive(Debug, Serialize)]
pub struct BrowserInfoResult {
    pub user_agent: String,
    pub cdp_url: String,
    pub vnc_url: String,
    pub cdp_ui_url: Option<String>,
    pub viewport: BrowserViewport,
}

/// `SandboxResponse`: the envelope's fields next to the info, not inside `data`.
#[derive(Debug, Serialize)]
pub struct SandboxResponse {
    pub success: bool,
    pub message: String,
    pub data: Option<String>,
    pub hint: Option<String>,
    pub home_dir: String,
    pub workspace: String,
    pub version: String,
    pub detail: SandboxDetail,
}

#[derive(Debug, Serialize)]
pub struct SandboxDetail {
    pub system: SystemEnv,
    pub runtime: RuntimeEnv,
    pub utils: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct SystemEnv {
    pub os: String,
    pub os_version: String,
    pub arch: String,
    pub user: String,
    pub home_dir: String,
    pub workspace: String,
    pub timezone: String,
    pub occupied_ports: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct RuntimeEnv {
    pub python: Vec<ToolSpec>,
    pub nodejs: Vec<ToolSpec>,
}

#[derive(Debug, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub path: String,
}
