//! The browser tools: one action of the session's browser each (`browser.<action>`, served
//! by the browser-router, which starts one browser per session on first use). An action that
//! waits for a person (a password field) answers at once with the confirmation id and how to
//! approve, as `run_code` does, instead of holding the model for the router's timeout.

use base64::Engine;
use messages::browser::{BrowserCommand, BrowserRequest, BrowserResult, ContentFormat, Target};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router, ErrorData};
use tokio::sync::oneshot;

use crate::params::*;
use crate::render;
use crate::tools::{MeshTools, REQUESTED_BY};

impl MeshTools {
    async fn browse(&self, session_id: String, command: BrowserCommand) -> CallToolResult {
        match self.act(BrowserRequest::new(session_id, command)).await {
            Ok(r) => render::browser(&r),
            Err(answered) => answered,
        }
    }

    /// One action, or the tool's answer instead of its result: the router's notice that a
    /// person must decide ends the call at once (the action goes on waiting in the router and
    /// runs if approved; its own answer then goes nowhere), or the action failed.
    async fn act(&self, req: BrowserRequest) -> Result<BrowserResult, CallToolResult> {
        let action = req.command.action();
        let req = BrowserRequest {
            requested_by: Some(REQUESTED_BY.into()),
            ..req
        };
        let (noticed, notice) = oneshot::channel();
        let mut noticed = Some(noticed);
        let browser = self.mesh.browser();
        let acted = browser.act_notified(&req, move |awaiting| {
            if let Some(tx) = noticed.take() {
                let _ = tx.send(awaiting);
            }
        });
        tokio::select! {
            biased;
            acted = acted => acted.map_err(|e| render::client_error(&e)),
            Ok(awaiting) = notice => Err(render::awaiting_action(action, &awaiting, messages::now_ms())),
        }
    }

    /// The PNG of a screenshot: inline in the reply when the router sent it, else read from
    /// the session's files (the router leaves large ones there only).
    async fn screenshot_png(
        &self,
        session: &str,
        r: &BrowserResult,
    ) -> Result<String, CallToolResult> {
        if let Some(b64) = &r.screenshot_base64 {
            return Ok(b64.clone());
        }
        let Some(path) = &r.screenshot_path else {
            return Err(render::error(
                "internal",
                "the browser returned neither a screenshot nor where it saved one",
            ));
        };
        match self.mesh.workspace().read(session, path).await {
            Ok(png) => Ok(base64::engine::general_purpose::STANDARD.encode(png)),
            Err(e) => Err(render::client_error(&e)),
        }
    }
}

/// `click` and `fill` name their element one way or the other (an index wins).
fn target(index: Option<u32>, selector: Option<String>) -> Result<Target, CallToolResult> {
    match (index, selector) {
        (Some(i), _) => Ok(Target::Index(i)),
        (None, Some(s)) => Ok(Target::Selector(s)),
        (None, None) => Err(render::error(
            "bad_request",
            "give the element's index (from browser_elements) or a CSS selector",
        )),
    }
}

#[tool_router(router = browser_tools, vis = "pub(crate)")]
impl MeshTools {
    #[tool(
        description = "Open a web address in the session's browser (started on first use). \
        Answers with the page's final URL and title.",
        annotations(title = "Open a page", open_world_hint = true)
    )]
    async fn browser_navigate(
        &self,
        Parameters(p): Parameters<BrowserNavigate>,
    ) -> Result<CallToolResult, ErrorData> {
        let navigate = BrowserCommand::Navigate { url: p.url };
        Ok(self.browse(p.session_id, navigate).await)
    }

    #[tool(
        description = "List the interactive elements of the current page (links, buttons, \
        fields) with an index each, for browser_click and browser_fill.",
        annotations(
            title = "List page elements",
            read_only_hint = true,
            open_world_hint = true
        )
    )]
    async fn browser_elements(
        &self,
        Parameters(p): Parameters<BrowserSession>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self.browse(p.session_id, BrowserCommand::Elements).await)
    }

    #[tool(
        description = "Click an element of the current page, by its index from \
        browser_elements or by a CSS selector. Answers with the page's URL and title after.",
        annotations(title = "Click", open_world_hint = true)
    )]
    async fn browser_click(
        &self,
        Parameters(p): Parameters<BrowserClick>,
    ) -> Result<CallToolResult, ErrorData> {
        let target = match target(p.index, p.selector) {
            Ok(t) => t,
            Err(refused) => return Ok(refused),
        };
        let click = BrowserCommand::Click { target };
        Ok(self.browse(p.session_id, click).await)
    }

    #[tool(
        description = "Type text into a field of the current page, by its index from \
        browser_elements or by a CSS selector. Password and payment fields need a person's \
        approval: the answer then says 'awaiting approval' with a confirmation_id at once; the \
        field is filled once an operator approves (check with browser_content).",
        annotations(title = "Fill a field", open_world_hint = true)
    )]
    async fn browser_fill(
        &self,
        Parameters(p): Parameters<BrowserFill>,
    ) -> Result<CallToolResult, ErrorData> {
        let target = match target(p.index, p.selector) {
            Ok(t) => t,
            Err(refused) => return Ok(refused),
        };
        let fill = BrowserCommand::Fill {
            target,
            text: p.text,
        };
        Ok(self.browse(p.session_id, fill).await)
    }

    #[tool(
        description = "Take a PNG screenshot of the session's current page (the visible part, \
        or the whole page) and return it as an image.",
        annotations(title = "Screenshot", read_only_hint = true, open_world_hint = true)
    )]
    async fn browser_screenshot(
        &self,
        Parameters(p): Parameters<BrowserScreenshot>,
    ) -> Result<CallToolResult, ErrorData> {
        let screenshot = BrowserCommand::Screenshot {
            full_page: p.full_page,
            inline: true,
        };
        let req = BrowserRequest::new(p.session_id.clone(), screenshot);
        let shot = match self.act(req).await {
            Ok(shot) => shot,
            Err(answered) => return Ok(answered),
        };
        let png = match self.screenshot_png(&p.session_id, &shot).await {
            Ok(png) => png,
            Err(failed) => return Ok(failed),
        };
        let mut result = render::browser(&shot);
        result.content.push(ContentBlock::image(png, "image/png"));
        Ok(result)
    }

    #[tool(
        description = "The current page's content: its visible text (default) or its HTML.",
        annotations(title = "Page content", read_only_hint = true, open_world_hint = true)
    )]
    async fn browser_content(
        &self,
        Parameters(p): Parameters<BrowserContent>,
    ) -> Result<CallToolResult, ErrorData> {
        let format = match p.format.as_deref().unwrap_or("text") {
            "text" => ContentFormat::Text,
            "html" => ContentFormat::Html,
            other => {
                return Ok(render::error(
                    "bad_request",
                    &format!("unknown format {other:?}; expected text or html"),
                ))
            }
        };
        let content = BrowserCommand::Content { format };
        Ok(self.browse(p.session_id, content).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_click_needs_an_index_or_a_selector() {
        assert!(target(None, None).is_err());
        assert_eq!(target(Some(3), None).unwrap(), Target::Index(3));
        assert_eq!(
            target(Some(3), Some("#go".into())).unwrap(),
            Target::Index(3)
        );
        assert_eq!(
            target(None, Some("#go".into())).unwrap(),
            Target::Selector("#go".into())
        );
    }
}
