//! `sandmesh audit`: read (or follow) the audit trail in `SANDBOX_AUDIT`.

use futures::StreamExt;
use sandmesh_client::audit::AuditQuery;
use sandmesh_client::MeshClient;

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

pub async fn run(mesh: &MeshClient, args: AuditArgs) -> anyhow::Result<i32> {
    let query = AuditQuery {
        kind: args.kind.clone(),
        last: args.last,
        follow: args.follow,
    };
    let mut events = mesh.audit().events(&query).await?;
    while let Some(event) = events.next().await {
        let event = event?;
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
            outln!("{}", serde_json::to_string(&event)?);
        } else {
            outln!(
                "{} {:<22} exec={} session={} by={} {}",
                event.id,
                event.kind().as_str(),
                event.execution_id.as_deref().unwrap_or("-"),
                event.session_id.as_deref().unwrap_or("-"),
                event.actor.as_deref().unwrap_or("-"),
                event.details.to_value()
            );
        }
    }
    Ok(0)
}
