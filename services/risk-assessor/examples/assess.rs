//! Assess code from stdin in-process and print the assessment as JSON:
//! `echo 'rm -rf /' | cargo run -p sandmesh-risk-assessor --example assess -- shell [strict|permissive]`

use std::io::Read;

use messages::risk::AssessRequest;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let content_type = args.next().unwrap_or_else(|| "python".into());
    let content_type = risk_assessor::service::content_type(&content_type)
        .map_err(|e| anyhow::anyhow!(e.message))?;
    let mode = args
        .next()
        .map(|m| risk_assessor::config::parse_mode(&m))
        .transpose()
        .map_err(|e| anyhow::anyhow!(e))?;
    let mut content = String::new();
    std::io::stdin().read_to_string(&mut content)?;
    let request = AssessRequest {
        content,
        content_type,
        params: None,
        mode,
        files: Vec::new(),
    };
    let assessment = risk_assessor::assess(&request)?;
    println!("{}", serde_json::to_string_pretty(&assessment)?);
    Ok(())
}
