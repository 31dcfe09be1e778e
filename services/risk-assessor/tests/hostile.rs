//! Pathological input assessed in-process: long chains, huge argument lists, thousands of
//! findings on unparsable text. Each must return (no timing is asserted; a quadratic path
//! shows up as a test that never finishes).

use messages::risk::{AssessRequest, ContentType, RiskLevel};
use risk_assessor::assess;

fn run(content_type: ContentType, content: String) -> messages::risk::RiskAssessment {
    assess(&AssessRequest {
        content,
        content_type,
        params: None,
        mode: None,
        files: Vec::new(),
    })
    .expect("under the ceiling")
}

#[test]
fn long_chains_and_argument_lists_are_assessed() {
    let python = format!("x = os{}.system('id')", ".path".repeat(20_000));
    assert!(run(ContentType::Python, python).level >= RiskLevel::Safe);
    let javascript = format!("a{}('x')", ".b".repeat(20_000));
    run(ContentType::Javascript, javascript);
    let shell = format!("rm {}", "a ".repeat(100_000));
    assert_eq!(run(ContentType::Shell, shell).level, RiskLevel::High);
    let eval = format!("eval {}", "'ls' ".repeat(40_000));
    run(ContentType::Shell, eval);
}

#[test]
fn thousands_of_text_findings_are_capped_in_the_reply() {
    let a = run(ContentType::Python, "eval(".repeat(40_000));
    assert_eq!(a.level, RiskLevel::Critical);
    assert!(a.findings.len() <= risk_assessor::Limits::default().max_findings);
    assert!(a.reason.contains("more findings"), "{}", a.reason);
}

#[test]
fn content_above_the_ceiling_is_refused_before_any_work() {
    let max = risk_assessor::Limits::default().max_content_bytes;
    let err = assess(&AssessRequest {
        content: "x".repeat(max + 1),
        content_type: ContentType::Python,
        params: None,
        mode: None,
        files: Vec::new(),
    })
    .unwrap_err();
    assert_eq!(
        err,
        risk_assessor::AssessError::TooLarge { size: max + 1, max }
    );
}
