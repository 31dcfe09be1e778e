//! Marking risky code: each finding's span (byte offsets into the code, or its whole line when
//! only the line is known) becomes a `<mark>` in the escaped excerpt.

use std::fmt::Write as _;

use messages::risk::Finding;

use crate::escape::esc;

/// The excerpt, escaped, with each finding's span (byte offsets into the code, or its whole
/// line when only the line is known) wrapped in `<mark>`. Spans beyond the excerpt (it is cut
/// at 2 KiB) or not on character boundaries are clipped to what can be marked.
pub fn highlight(code: &str, findings: &[Finding]) -> String {
    let mut spans: Vec<(usize, usize, String)> = findings
        .iter()
        .filter_map(|f| {
            let (start, end) = span_of(code, f)?;
            Some((start, end, format!("{}: {}", f.rule, f.description)))
        })
        .collect();
    spans.sort_by_key(|s| (s.0, s.1));
    // Overlapping spans merge into one mark naming every rule.
    let mut merged: Vec<(usize, usize, String)> = Vec::new();
    for (start, end, title) in spans {
        match merged.last_mut() {
            Some(last) if start < last.1 => {
                last.1 = last.1.max(end);
                last.2.push_str("; ");
                last.2.push_str(&title);
            }
            _ => merged.push((start, end, title)),
        }
    }
    let mut out = String::with_capacity(code.len() + 64);
    let mut at = 0;
    for (start, end, title) in merged {
        out.push_str(&esc(&code[at..start]));
        let _ = write!(
            out,
            "<mark class=\"risk\" title=\"{}\">{}</mark>",
            esc(&title),
            esc(&code[start..end])
        );
        at = end;
    }
    out.push_str(&esc(&code[at..]));
    out
}

fn span_of(code: &str, f: &Finding) -> Option<(usize, usize)> {
    let (start, end) = match (f.start, f.end, f.line) {
        (Some(s), Some(e), _) if s < e => (s as usize, e as usize),
        (_, _, Some(line)) if line > 0 => line_span(code, line as usize)?,
        _ => return None,
    };
    let mut start = start.min(code.len());
    let mut end = end.min(code.len());
    while !code.is_char_boundary(start) {
        start -= 1;
    }
    while !code.is_char_boundary(end) {
        end += 1;
    }
    (start < end).then_some((start, end))
}

fn line_span(code: &str, line: usize) -> Option<(usize, usize)> {
    let mut offset = 0;
    for (n, text) in code.split_inclusive('\n').enumerate() {
        if n + 1 == line {
            return Some((offset, offset + text.trim_end_matches('\n').len()));
        }
        offset += text.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::risk::RiskLevel;

    fn finding(rule: &str, start: u32, end: u32) -> Finding {
        Finding {
            rule: rule.into(),
            severity: RiskLevel::High,
            description: "<b>bad</b>".into(),
            line: None,
            start: Some(start),
            end: Some(end),
            path: None,
        }
    }

    #[test]
    fn risky_spans_are_marked_and_escaped() {
        let code = "import os\nos.system('<x>')\n";
        let html = highlight(code, &[finding("shell", 10, 26)]);
        assert_eq!(
            html,
            "import os\n<mark class=\"risk\" title=\"shell: &lt;b&gt;bad&lt;/b&gt;\">\
             os.system(&#39;&lt;x&gt;&#39;)</mark>\n"
        );
    }

    #[test]
    fn spans_overlap_cut_or_fall_inside_characters() {
        let code = "é = 1; rm()";
        // Overlapping spans merge; a span past the end is clipped; inside `é` widens to it.
        let html = highlight(
            code,
            &[finding("a", 1, 3), finding("b", 2, 5), finding("c", 8, 400)],
        );
        let bad = "&lt;b&gt;bad&lt;/b&gt;";
        assert_eq!(
            html,
            format!(
                "<mark class=\"risk\" title=\"a: {bad}; b: {bad}\">é = </mark>1; \
                 <mark class=\"risk\" title=\"c: {bad}\">rm()</mark>"
            )
        );
        // A finding with a line only marks that line.
        let line_only = Finding {
            line: Some(2),
            start: None,
            end: None,
            ..finding("l", 0, 0)
        };
        assert!(highlight("a\nbb\n", &[line_only]).contains(">bb</mark>"));
    }
}
