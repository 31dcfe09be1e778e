//! The page actions against a real headless Chromium (the host's `chromium`:
//! `scripts/install-tools.sh --tests` installs Debian's; `SANDMESH_CHROMIUM` names another).

use std::time::Duration;

use cdp::{chromium_binary, CdpError, Connection, ImageFormat, LocalChromium, Page};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);

/// A form that reports what happened to it in `#out`.
const FORM: &str = "<!doctype html><title>form</title><body style='margin:0'>\
    <form onsubmit=\"document.getElementById('out').textContent = 'sent ' + \
    document.getElementById('name').value; return false\">\
    <input id=name><button id=go type=button \
    onclick=\"document.getElementById('out').textContent = 'clicked'\">go</button></form>\
    <p id=out>nothing</p><div style='height:3000px'>tall</div></body>";

fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let be = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_in_real_chromium_takes_every_shared_action() {
    let bin = chromium_binary().unwrap_or_else(|e| panic!("{e}"));
    let chromium = LocalChromium::launch(&bin, &[], LIMIT)
        .await
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    // Discovery over HTTP, as the browser-router reaches a container's Chromium.
    let addr = chromium
        .ws_url()
        .strip_prefix("ws://")
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_string();
    let mut browser = Connection::browser(&format!("http://{addr}"), LIMIT)
        .await
        .unwrap();
    let version = browser.call("Browser.getVersion", json!({})).await.unwrap();
    assert!(version["product"].as_str().unwrap().contains("Chrome"));

    let url = format!("data:text/html,{}", FORM.replace('#', "%23"));
    let mut page = Page::create(browser, &url).await.unwrap();
    page.set_viewport(640, 480).await.unwrap();
    let loaded = page
        .wait_until(
            "document.readyState === 'complete' && !!document.getElementById('go')",
            LIMIT,
        )
        .await
        .unwrap();
    assert_eq!(loaded, Some(json!(true)));
    let (_, title) = page.location().await.unwrap();
    assert_eq!(title, "form");

    // A real click on the button's centre.
    let go = page
        .element_center("document.getElementById('go')")
        .await
        .unwrap()
        .expect("the button");
    page.click_at(go, "left", 1).await.unwrap();
    assert!(page.text().await.unwrap().contains("clicked"));
    assert_eq!(
        page.element_center("document.getElementById('missing')")
            .await
            .unwrap(),
        None
    );

    // Typed text, then Enter submits the form.
    let name = page
        .element_center("document.getElementById('name')")
        .await
        .unwrap()
        .unwrap();
    page.click_at(name, "left", 1).await.unwrap();
    page.insert_text("Ada <b>").await.unwrap();
    page.press_key("Enter", 0).await.unwrap();
    let sent = page
        .wait_until(
            "document.getElementById('out').textContent.startsWith('sent')",
            LIMIT,
        )
        .await
        .unwrap();
    assert!(sent.is_some(), "{}", page.text().await.unwrap());
    assert!(page.text().await.unwrap().contains("sent Ada <b>"));
    let e = page.press_key("NoSuchKey", 0).await.unwrap_err();
    assert!(matches!(e, CdpError::UnknownKey(_)), "{e:?}");

    // Screenshots: the viewport, and the whole document.
    let shot = page.screenshot(ImageFormat::Png, false).await.unwrap();
    assert_eq!(png_size(&shot), (640, 480));
    let full = page.screenshot(ImageFormat::Png, true).await.unwrap();
    let (w, h) = png_size(&full);
    // The document's width: the viewport's less a scrollbar.
    assert!((600..=640).contains(&w) && h > 3000, "{w}x{h}");
    let jpeg = page
        .screenshot(ImageFormat::Jpeg(Some(50)), false)
        .await
        .unwrap();
    assert!(jpeg.starts_with(&[0xff, 0xd8]), "a JPEG");

    let html = page.html().await.unwrap();
    assert!(html.starts_with("<!DOCTYPE html><html>"), "{html}");

    // Errors: a script that throws, a command Chromium does not know, a wait in vain.
    let e = page.evaluate("throw new Error('boom')").await.unwrap_err();
    assert!(
        matches!(&e, CdpError::Script(t) if t.contains("boom")),
        "{e:?}"
    );
    let e = page.call("Nope.nope", json!({})).await.unwrap_err();
    assert!(matches!(e, CdpError::Protocol { .. }), "{e:?}");
    let never = page
        .wait_until("false", Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(never, None);

    // The same page found through /json/list, on a socket of its own.
    let target = page.target().to_string();
    let mut own = Page::attach(&addr, &target, LIMIT).await.unwrap();
    assert!(own.text().await.unwrap().contains("sent Ada"));
    let first = Page::first(&addr, LIMIT).await.unwrap();
    assert!(!first.target().is_empty());

    chromium.stop().await;
    // Chromium gone: the page's socket says so.
    let e = page.evaluate("1").await.unwrap_err();
    assert!(matches!(e, CdpError::Closed), "{e:?}");
}
