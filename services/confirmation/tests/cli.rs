//! The `sandmesh confirm` commands (cli/src/confirm.rs, compiled here) against a live service.

mod common;
#[path = "../../../cli/src/confirm.rs"]
mod confirm;

use std::io::Write;
use std::sync::{Arc, Mutex};

use clap::Parser;
use common::*;
use confirm::ConfirmCommand;
use messages::confirm::{ConfirmScope, ConfirmState};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: ConfirmCommand,
}

fn parse(args: &[&str]) -> Result<ConfirmCommand, clap::Error> {
    Cli::try_parse_from(std::iter::once("confirm").chain(args.iter().copied())).map(|c| c.cmd)
}

#[test]
fn arguments_parse_as_documented() {
    assert_eq!(
        parse(&["approve", "01J", "--scope", "session", "--by", "alice"]).unwrap(),
        ConfirmCommand::Approve {
            id: "01J".into(),
            scope: ConfirmScope::Session,
            by: Some("alice".into()),
            reason: None,
        }
    );
    assert_eq!(
        parse(&["deny", "01J", "--reason", "no"]).unwrap(),
        ConfirmCommand::Deny {
            id: "01J".into(),
            reason: Some("no".into()),
            by: None,
        }
    );
    assert!(parse(&["approve", "01J", "--scope", "forever"]).is_err());
    assert!(parse(&["list", "--state", "maybe"]).is_err());
    assert!(parse(&["deny"]).is_err());
}

#[tokio::test]
async fn approve_and_deny_decide_and_a_repeat_is_refused() {
    let nats = test_support::NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);
    let s = subjects();

    let one = ask(&c, &request(Some("s1"), &["net.socket"], false))
        .await
        .unwrap();
    let two = ask(&c, &request(Some("s1"), &["fs.write"], false))
        .await
        .unwrap();
    let list = parse(&["list", "--session", "s1"]).unwrap();
    assert_eq!(confirm::run(&c, &s, list).await.unwrap(), 0);

    let approve = parse(&["approve", &one.id, "--scope", "session", "--by", "alice"]).unwrap();
    assert_eq!(confirm::run(&c, &s, approve.clone()).await.unwrap(), 0);
    let approved = get(&c, &one.id).await.unwrap();
    assert_eq!(approved.state, ConfirmState::Approved);
    assert_eq!(approved.scope, ConfirmScope::Session);
    assert_eq!(approved.by.as_deref(), Some("alice"));
    // Already decided: refused, exit 1, the first decision stands.
    assert_eq!(confirm::run(&c, &s, approve).await.unwrap(), 1);

    let deny = parse(&["deny", &two.id, "--reason", "writes outside", "--by", "bob"]).unwrap();
    assert_eq!(confirm::run(&c, &s, deny).await.unwrap(), 0);
    let denied = get(&c, &two.id).await.unwrap();
    assert_eq!(denied.state, ConfirmState::Denied);
    assert_eq!(denied.reason.as_deref(), Some("writes outside"));

    let unknown = parse(&["approve", &messages::new_id()]).unwrap();
    assert_eq!(confirm::run(&c, &s, unknown).await.unwrap(), 1);
    instance.stop().await;
}

/// A writer the test can read while the watch writes to it.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).to_string()
    }
}

#[tokio::test]
async fn watch_prints_the_queue_and_its_changes() {
    let nats = test_support::NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);

    let before = ask(&c, &request(None, &["net.socket"], false))
        .await
        .unwrap();
    let out = Shared::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let watch = {
        let (c, out) = (c.clone(), out.clone());
        tokio::spawn(async move {
            confirm::watch_until(&c, &subjects(), None, out, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    eventually("the queue is printed", || {
        let found = out.text().contains(&before.id);
        async move { found.then_some(()) }
    })
    .await;
    assert!(out.text().starts_with("1 pending"), "{}", out.text());

    let after = ask(&c, &request(None, &["fs.write"], false)).await.unwrap();
    decide(&c, &decision(&before.id, true, "alice", ConfirmScope::Once))
        .await
        .unwrap();
    eventually("both changes are printed", || {
        let text = out.text();
        let found =
            text.contains(&format!("+ {}", after.id)) && text.contains(&format!("- {}", before.id));
        async move { found.then_some(()) }
    })
    .await;
    let _ = stop.send(());
    within("watch stops", watch).await.unwrap().unwrap();
    let text = out.text();
    assert!(
        text.contains("approved") && text.contains("by alice"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("(1 pending)"), "{text}");
    instance.stop().await;
}
