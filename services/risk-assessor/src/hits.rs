//! Rule hits collected while analysing one source: which rule, where, and an optional detail.

use std::collections::{HashMap, HashSet};

use regex::Regex;
use tree_sitter::Node;

use crate::syntax;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Index into `Policy::rules`.
    pub rule: usize,
    pub line: u32,
    pub start: u32,
    pub end: u32,
    pub detail: Option<String>,
}

/// Hits, one per rule and start offset: `os.environ.get` and `os.environ` start at the same
/// byte and are one finding (the narrower span is kept).
#[derive(Debug, Default)]
pub struct Hits {
    items: Vec<Hit>,
    by_start: HashMap<(usize, u32), usize>,
    /// Spans that have a hit, for `covers` (a lookup, not a scan: scripts can have 100k hits).
    spans: HashSet<(u32, u32)>,
}

impl Hits {
    pub fn add(&mut self, rule: usize, node: Node, detail: Option<String>) {
        self.add_span(
            rule,
            syntax::line_of(node),
            node.start_byte(),
            node.end_byte(),
            detail,
        );
    }

    pub fn add_span(
        &mut self,
        rule: usize,
        line: u32,
        start: usize,
        end: usize,
        detail: Option<String>,
    ) {
        let (start, end) = (start as u32, end as u32);
        self.spans.insert((start, end));
        match self.by_start.get(&(rule, start)) {
            Some(&i) => {
                if end < self.items[i].end {
                    self.items[i].end = end;
                }
            }
            None => {
                self.by_start.insert((rule, start), self.items.len());
                self.items.push(Hit {
                    rule,
                    line,
                    start,
                    end,
                    detail,
                });
            }
        }
    }

    /// Every match of `regex` in `source` (an offset shifts spans of an embedded script).
    /// Lines are counted incrementally: matches come in order, so the whole scan stays linear.
    pub fn add_regex(&mut self, rule: usize, regex: &Regex, source: &str, offset: usize) {
        let (mut line, mut counted) = (1u32, 0usize);
        for m in regex.find_iter(source) {
            line += syntax::line_at(&source[counted..m.start()], usize::MAX) - 1;
            counted = m.start();
            self.add_span(rule, line, offset + m.start(), offset + m.end(), None);
        }
    }

    /// Whether any hit already covers this exact span.
    pub fn covers(&self, start: usize, end: usize) -> bool {
        self.spans.contains(&(start as u32, end as u32))
    }

    pub fn into_vec(self) -> Vec<Hit> {
        self.items
    }
}
