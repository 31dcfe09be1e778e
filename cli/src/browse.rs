//! `sandmesh browse SESSION ACTION [TARGET] [TEXT]`: one browser action in the session's
//! browser, enough to try the browser-router by hand:
//!
//! ```text
//! sandmesh browse s1 navigate https://example.com
//! sandmesh browse s1 elements
//! sandmesh browse s1 click 3            # an index from `elements`, or a CSS selector
//! sandmesh browse s1 fill 2 alice
//! sandmesh browse s1 screenshot --full-page
//! ```

use anyhow::Context;
use messages::browser::{
    BrowserAction, BrowserPayload, BrowserRequest, BrowserResult, ContentFormat,
};
use sandmesh_client::{ClientError, MeshClient};

#[derive(Debug, clap::Args)]
pub struct BrowseArgs {
    pub session: String,
    /// navigate, back, click, fill, type, press_key, scroll, wait_for, elements, screenshot,
    /// content, evaluate, close
    pub action: String,
    /// URL (navigate), element index or CSS selector (click, fill, type), key (press_key),
    /// text (wait_for), script (evaluate), text|html (content)
    pub target: Option<String>,
    /// The text to fill or type.
    pub text: Option<String>,
    /// Screenshot the whole page, not just the viewport.
    #[arg(long)]
    pub full_page: bool,
    /// Pixels to scroll down (negative: up); default one screen.
    #[arg(long, allow_hyphen_values = true)]
    pub dy: Option<i64>,
    /// Print the whole reply as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The flags as the payload any client sends, checked for `action` as the router checks it.
fn request(args: &BrowseArgs, action: BrowserAction) -> anyhow::Result<BrowserRequest> {
    let mut req = BrowserPayload {
        session_id: args.session.clone(),
        full_page: args.full_page,
        dy: args.dy,
        requested_by: Some("cli".into()),
        ..Default::default()
    };
    let target = args.target.clone();
    match action {
        BrowserAction::Navigate => req.url = target,
        BrowserAction::Click | BrowserAction::Fill | BrowserAction::Type => {
            match target.as_deref().map(str::parse::<u32>) {
                Some(Ok(i)) => req.index = Some(i),
                _ => req.selector = target,
            }
            req.text = args.text.clone();
        }
        BrowserAction::PressKey => req.key = target,
        BrowserAction::WaitFor => req.text = target,
        BrowserAction::Evaluate => req.script = target,
        BrowserAction::Content => {
            req.format = match target.as_deref() {
                None | Some("text") => ContentFormat::Text,
                Some("html") => ContentFormat::Html,
                Some(other) => anyhow::bail!("content is text or html, not {other:?}"),
            }
        }
        _ => {}
    }
    Ok(BrowserRequest::parse(action, req)?)
}

fn print(result: &BrowserResult) {
    outln!(
        "{} — {}{}",
        result.url.as_deref().unwrap_or("-"),
        result.title.as_deref().unwrap_or(""),
        if result.state_lost {
            "  (the previous browser died: page state lost)"
        } else {
            ""
        }
    );
    for e in &result.elements {
        let kind = e
            .input_type
            .as_deref()
            .map(|t| format!(" type={t}"))
            .unwrap_or_default();
        outln!("[{}] {} {:?} <{}{kind}>", e.index, e.role, e.name, e.tag);
    }
    if let Some(path) = &result.screenshot_path {
        outln!("screenshot: {path} (sandmesh ws get SESSION {path} -o shot.png)");
    }
    if let Some(content) = &result.content {
        outln!("{content}");
    }
    if let Some(value) = &result.value {
        outln!("{value}");
    }
}

/// Runs one action; returns the exit code (0 done, 1 refused or failed).
pub async fn run(mesh: &MeshClient, args: BrowseArgs) -> anyhow::Result<i32> {
    let action = BrowserAction::parse(&args.action).with_context(|| {
        let known: Vec<_> = BrowserAction::ALL.iter().map(|a| a.as_str()).collect();
        format!(
            "unknown action {:?}; one of: {}",
            args.action,
            known.join(", ")
        )
    })?;
    let req = request(&args, action)?;
    match mesh.browser().act(&req).await {
        Ok(result) => {
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                print(&result);
            }
            Ok(0)
        }
        Err(e @ ClientError::Service { .. }) => {
            eprintln!("sandmesh: {e}");
            Ok(1)
        }
        Err(e) => Err(e.into()),
    }
}
