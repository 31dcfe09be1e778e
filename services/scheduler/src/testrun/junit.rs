//! Reads a JUnit XML report (as the runner's parent writes it, and pytest's `--junitxml` or
//! other tools would) into per-test results. Even sealed, its names and messages come from the
//! tests' own process, so it is hostile input: its size, depth and number of cases are bounded,
//! a DTD (the door to entity tricks) is refused, and anything malformed is an error with a
//! clear message, never a panic. Totals are counted from the cases, not taken from the
//! report's own attributes.

use std::borrow::Cow;

use messages::testrun::{
    TestCase, TestCaseStatus, MAX_MESSAGE_BYTES, MAX_REPORT_BYTES, MAX_TEST_CASES,
};
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use crate::error::JunitError;

/// Deeper nesting than any test tool writes (`testsuites > testsuite > testcase > failure`,
/// with nested suites a few levels more).
pub const MAX_DEPTH: usize = 32;

/// A JUnit report as read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Junit {
    /// The test cases, in document order.
    pub cases: Vec<TestCase>,
    /// The root element's attributes that sandmesh's runner writes: how the run ended
    /// (`sandmesh-run`) and why its records were refused (`sandmesh-reason`).
    pub run: Option<String>,
    pub reason: Option<String>,
}

/// Reads a JUnit report.
pub fn parse(report: &[u8]) -> Result<Junit, JunitError> {
    let size = report.len() as u64;
    if size > MAX_REPORT_BYTES {
        return Err(JunitError::TooLarge { size });
    }
    let text = std::str::from_utf8(report).map_err(|_| JunitError::NotUtf8)?;
    let mut reader = Reader::from_str(text);
    reader.config_mut().check_end_names = true;
    let malformed = |reader: &Reader<&[u8]>, reason: String| JunitError::Malformed {
        position: reader.buffer_position(),
        reason,
    };
    let mut cases = Vec::new();
    let (mut run, mut reason) = (None, None);
    // The case being read (between `<testcase>` and `</testcase>`) and the element it is
    // reading the text of (a `<failure>` without a `message` attribute).
    let mut open: Option<TestCase> = None;
    let mut text_of: Option<TestCaseStatus> = None;
    let mut depth = 0usize;
    let mut rooted = false;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| malformed(&reader, e.to_string()))?;
        match event {
            Event::DocType(_) => return Err(JunitError::Dtd),
            Event::Start(ref e) | Event::Empty(ref e) => {
                let empty = matches!(event, Event::Empty(_));
                if depth == 0 {
                    rooted = matches!(e.local_name().as_ref(), b"testsuites" | b"testsuite");
                    if !rooted {
                        return Err(JunitError::NotJunit);
                    }
                    let attr = |name: &str| attribute(e, name).map_err(|r| malformed(&reader, r));
                    run = attr("sandmesh-run")?;
                    reason = attr("sandmesh-reason")?;
                }
                if !empty {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return Err(JunitError::TooDeep { limit: MAX_DEPTH });
                    }
                }
                let attr = |name: &str| attribute(e, name).map_err(|r| malformed(&reader, r));
                match (e.local_name().as_ref(), open.as_mut()) {
                    (b"testcase", Some(_)) => {
                        return Err(malformed(
                            &reader,
                            "a <testcase> inside a <testcase>".into(),
                        ))
                    }
                    (b"testcase", None) => {
                        if cases.len() == MAX_TEST_CASES {
                            return Err(JunitError::TooManyCases);
                        }
                        let case = TestCase {
                            name: attr("name")?.unwrap_or_default(),
                            classname: attr("classname")?.filter(|c| !c.is_empty()),
                            status: TestCaseStatus::Passed,
                            duration_ms: attr("time")?.as_deref().map_or(0, seconds_to_ms),
                            message: None,
                        };
                        if empty {
                            cases.push(case);
                        } else {
                            open = Some(case);
                        }
                    }
                    (verdict @ (b"failure" | b"error" | b"skipped"), Some(case)) => {
                        // The first verdict stands (pytest adds a teardown `<error>` after a
                        // test's own `<failure>`; the test failed).
                        if case.status != TestCaseStatus::Passed {
                            continue;
                        }
                        case.status = match verdict {
                            b"failure" => TestCaseStatus::Failed,
                            b"error" => TestCaseStatus::Error,
                            _ => TestCaseStatus::Skipped,
                        };
                        case.message = attr("message")?.map(|m| clip(&m));
                        if case.message.is_none() && !empty {
                            text_of = Some(case.status);
                        }
                    }
                    _ => {}
                }
            }
            Event::End(ref e) => {
                depth = depth.saturating_sub(1);
                match e.local_name().as_ref() {
                    b"testcase" => cases.extend(open.take()),
                    b"failure" | b"error" | b"skipped" => text_of = None,
                    _ => {}
                }
            }
            Event::Text(ref t) => {
                if let (Some(_), Some(case)) = (text_of, open.as_mut()) {
                    let text = t
                        .unescape()
                        .map_err(|e| malformed(&reader, e.to_string()))?;
                    append_message(case, &text);
                }
            }
            Event::CData(ref t) => {
                if let (Some(_), Some(case)) = (text_of, open.as_mut()) {
                    append_message(case, &String::from_utf8_lossy(t));
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !rooted {
        return Err(JunitError::NotJunit);
    }
    if depth != 0 || open.is_some() {
        return Err(malformed(
            &reader,
            "the report ends inside an element".into(),
        ));
    }
    Ok(Junit { cases, run, reason })
}

/// An attribute's unescaped value (`Err` names what was wrong with it). Every attribute is
/// read, so a duplicated one is refused wherever it is.
fn attribute(e: &BytesStart, name: &str) -> Result<Option<String>, String> {
    let mut found = None;
    for attr in e.attributes() {
        let attr = attr.map_err(|e| e.to_string())?;
        if found.is_none() && attr.key.local_name().as_ref() == name.as_bytes() {
            let value = attr.unescape_value().map_err(|e| e.to_string())?;
            found = Some(Cow::into_owned(value));
        }
    }
    Ok(found)
}

/// JUnit's `time` (seconds, fractional) in whole milliseconds; nonsense reads as 0.
fn seconds_to_ms(time: &str) -> u64 {
    match time.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => (s * 1000.0).round().min(u64::MAX as f64) as u64,
        _ => 0,
    }
}

fn append_message(case: &mut TestCase, text: &str) {
    let message = case.message.get_or_insert_with(String::new);
    if message.len() < MAX_MESSAGE_BYTES {
        message.push_str(text);
        *message = clip(message.trim_start());
    }
}

/// At most [`MAX_MESSAGE_BYTES`], cut at a character boundary.
fn clip(text: &str) -> String {
    if text.len() <= MAX_MESSAGE_BYTES {
        return text.to_string();
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What pytest 7 writes for 3 passing, 1 failing and 1 erroring (fixture) test.
    const PYTEST: &str = r#"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1" skipped="0" tests="5" time="0.051" timestamp="2026-11-27T12:00:00" hostname="sandbox"><testcase classname="test_solution" name="test_add" time="0.001" /><testcase classname="test_solution" name="test_sub" time="0.002" /><testcase classname="test_solution" name="test_mul" time="0.001" /><testcase classname="test_solution" name="test_div" time="0.003"><failure message="assert 2.0 == 3&#10; +  where 2.0 = div(6, 3)">def test_div():
&gt;       assert div(6, 3) == 3
E       assert 2.0 == 3</failure></testcase><testcase classname="test_solution" name="test_with_broken_fixture" time="0.000"><error message="failed on setup with &quot;RuntimeError: no database&quot;">@pytest.fixture
def db():
&gt;   raise RuntimeError("no database")</error></testcase></testsuite></testsuites>"#;

    fn statuses(cases: &[TestCase]) -> Vec<(&str, TestCaseStatus)> {
        cases.iter().map(|c| (c.name.as_str(), c.status)).collect()
    }

    #[test]
    fn pytest_reports_read_per_test() {
        let cases = parse(PYTEST.as_bytes()).unwrap().cases;
        use TestCaseStatus::*;
        assert_eq!(
            statuses(&cases),
            [
                ("test_add", Passed),
                ("test_sub", Passed),
                ("test_mul", Passed),
                ("test_div", Failed),
                ("test_with_broken_fixture", Error),
            ]
        );
        assert_eq!(
            cases[3].message.as_deref(),
            Some("assert 2.0 == 3\n +  where 2.0 = div(6, 3)")
        );
        assert_eq!(cases[3].duration_ms, 3);
        assert_eq!(cases[3].classname.as_deref(), Some("test_solution"));
        assert!(cases[4].message.as_deref().unwrap().contains("no database"));
    }

    #[test]
    fn a_verdict_without_a_message_takes_its_text_and_skips_count() {
        let xml = r#"<testsuite><testcase name="a"><failure><![CDATA[boom]]> and more</failure></testcase><testcase name="b"><skipped message="later"/></testcase><testcase name="c" time="nonsense"><failure message="first"/><error message="teardown"/></testcase></testsuite>"#;
        let cases = parse(xml.as_bytes()).unwrap().cases;
        assert_eq!(cases[0].message.as_deref(), Some("boom and more"));
        assert_eq!(
            (cases[1].status, cases[1].message.as_deref()),
            (TestCaseStatus::Skipped, Some("later"))
        );
        assert_eq!(
            (
                cases[2].status,
                cases[2].message.as_deref(),
                cases[2].duration_ms
            ),
            (TestCaseStatus::Failed, Some("first"), 0)
        );
    }

    #[test]
    fn an_empty_suite_has_no_cases_and_the_root_says_how_the_run_ended() {
        assert_eq!(parse(b"<testsuites/>").unwrap(), Junit::default());
        let refused = parse(
            br#"<testsuites sandmesh-run="refused" sandmesh-reason="test &quot;a&quot; twice"><testsuite><testcase name="a"/></testsuite></testsuites>"#,
        )
        .unwrap();
        assert_eq!(refused.run.as_deref(), Some("refused"));
        assert_eq!(refused.reason.as_deref(), Some("test \"a\" twice"));
        assert_eq!(refused.cases.len(), 1);
    }

    #[test]
    fn hostile_reports_are_errors() {
        let deep = format!(
            "<testsuites>{}{}</testsuites>",
            "<testsuite>".repeat(MAX_DEPTH),
            "</testsuite>".repeat(MAX_DEPTH)
        );
        let many = format!(
            "<testsuite>{}</testsuite>",
            "<testcase name=\"t\"/>".repeat(MAX_TEST_CASES + 1)
        );
        let billion_laughs = r#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]><testsuite><testcase name="&lol2;"/></testsuite>"#;
        let external = r#"<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><testsuite><testcase name="&x;"/></testsuite>"#;
        let huge = vec![b' '; MAX_REPORT_BYTES as usize + 1];
        // The kind of error expected (compared by variant, not by position or reason).
        let malformed = || JunitError::Malformed {
            position: 0,
            reason: String::new(),
        };
        let cases: Vec<(&[u8], JunitError)> =
            vec![
            (deep.as_bytes(), JunitError::TooDeep { limit: MAX_DEPTH }),
            (many.as_bytes(), JunitError::TooManyCases),
            (billion_laughs.as_bytes(), JunitError::Dtd),
            (external.as_bytes(), JunitError::Dtd),
            (&huge, JunitError::TooLarge { size: 0 }),
            (b"\xff\xfe<testsuite/>", JunitError::NotUtf8),
            (b"", JunitError::NotJunit),
            (b"hello", JunitError::NotJunit),
            (b"<html><body/></html>", JunitError::NotJunit),
            (b"<testsuite><testcase name=\"a\">", malformed()),
            (b"<testsuite></testcase>", malformed()),
            (b"<testsuite><testcase name=\"&nope;\"/></testsuite>", malformed()),
            (
                b"<testsuite><testcase name=\"a\"><testcase name=\"b\"/></testcase></testsuite>",
                malformed(),
            ),
            (
                b"<testsuite><testcase name='a' name='b'/></testsuite>",
                malformed(),
            ),
        ];
        for (xml, expected) in cases {
            let e = parse(xml).expect_err(&String::from_utf8_lossy(&xml[..xml.len().min(60)]));
            assert_eq!(
                std::mem::discriminant(&e),
                std::mem::discriminant(&expected),
                "{e:?}"
            );
        }
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let xml = format!(
            "<testsuite><testcase name=\"a\"><failure message=\"{long}\"/></testcase></testsuite>"
        );
        let message = parse(xml.as_bytes())
            .unwrap()
            .cases
            .remove(0)
            .message
            .unwrap();
        assert!(message.len() <= MAX_MESSAGE_BYTES && message.len() > MAX_MESSAGE_BYTES - 2);
    }

    proptest! {
        /// Whatever the bytes, the parser answers (cases or an error) without panicking.
        #[test]
        fn any_input_is_answered(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(report) = parse(&bytes) {
                prop_assert!(report.cases.len() <= MAX_TEST_CASES);
            }
        }

        /// Reports cut anywhere are errors or a prefix of the cases, never a panic.
        #[test]
        fn truncated_reports_never_panic(cut in 0usize..PYTEST.len()) {
            let prefix = &PYTEST.as_bytes()[..cut];
            if let Ok(report) = parse(prefix) {
                prop_assert!(report.cases.len() <= 5);
            }
        }
    }
}
