//! `sandmesh audit`: read (or follow) the audit trail in `SANDBOX_AUDIT`.

use async_nats::jetstream::consumer::{self, DeliverPolicy};
use futures::StreamExt;
use messages::audit::AuditEvent;
use messages::Subjects;

#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    /// Keep printing new events as they arrive.
    #[arg(long, short)]
    pub follow: bool,
    /// Only events of this execution.
    #[arg(long)]
    pub execution: Option<String>,
    /// Only events of this session.
    #[arg(long)]
    pub session: Option<String>,
    /// Only this kind of event (e.g. `finished`, `risk_assessed`).
    #[arg(long)]
    pub kind: Option<String>,
    /// Print the last N events (before following).
    #[arg(long, default_value_t = 50)]
    pub last: u64,
    /// Print raw JSON lines.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(
    client: &async_nats::Client,
    subjects: &Subjects,
    args: AuditArgs,
) -> anyhow::Result<i32> {
    let js = async_nats::jetstream::new(client.clone());
    let mut stream = js.get_stream(subjects.audit_stream()).await?;
    let info = stream.info().await?.clone();
    let last_seq = info.state.last_sequence;
    let start = last_seq.saturating_sub(args.last.saturating_sub(1)).max(1);
    let filter = match &args.kind {
        Some(kind) => subjects.audit(kind),
        None => subjects.audit_all(),
    };
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: filter,
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let mut seen_to_end = info.state.messages == 0;
    loop {
        let next = if seen_to_end && !args.follow {
            break;
        } else if seen_to_end {
            messages.next().await
        } else {
            match tokio::time::timeout(std::time::Duration::from_secs(2), messages.next()).await {
                Ok(m) => m,
                Err(_) => break,
            }
        };
        let Some(Ok(msg)) = next else { break };
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        if seq >= last_seq {
            seen_to_end = true;
        }
        let Ok(event) = serde_json::from_slice::<AuditEvent>(&msg.payload) else {
            continue;
        };
        if args
            .execution
            .as_ref()
            .is_some_and(|e| event.execution_id.as_ref() != Some(e))
            || args
                .session
                .as_ref()
                .is_some_and(|s| event.session_id.as_ref() != Some(s))
        {
            continue;
        }
        if args.json {
            println!("{}", serde_json::to_string(&event)?);
        } else {
            println!(
                "{} {:<22} exec={} session={} by={} {}",
                event.id,
                event.kind.as_str(),
                event.execution_id.as_deref().unwrap_or("-"),
                event.session_id.as_deref().unwrap_or("-"),
                event.actor.as_deref().unwrap_or("-"),
                event.details
            );
        }
    }
    Ok(0)
}
