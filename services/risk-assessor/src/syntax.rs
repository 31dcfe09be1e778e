//! tree-sitter plumbing shared by the language analysers: parsing under a time budget with a
//! parser reused per thread, an iterative tree walk (a cursor, never recursion, so 100k nested
//! brackets cannot overflow the stack), spans, and evaluation of constant strings.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use tree_sitter::{Language, Node, ParseOptions, Parser, Tree};
use unicode_normalization::UnicodeNormalization;

/// The grammars, by analyser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grammar {
    Python,
    Javascript,
    Bash,
}

impl Grammar {
    fn language(self) -> Language {
        match self {
            Grammar::Python => tree_sitter_python::LANGUAGE.into(),
            Grammar::Javascript => tree_sitter_javascript::LANGUAGE.into(),
            Grammar::Bash => tree_sitter_bash::LANGUAGE.into(),
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// A field id looked up once: `child_by_field_name` compares the name against every field of
/// the grammar on each call, which dominated long attribute chains.
pub fn field_id(grammar: Grammar, name: &str) -> u16 {
    grammar
        .language()
        .field_id_for_name(name)
        .map_or(0, |id| id.get())
}

/// Field ids of one grammar, resolved on first use.
macro_rules! fields {
    ($grammar:expr; $($name:ident),* $(,)?) => {
        #[allow(non_snake_case)]
        struct Fields { $($name: u16),* }
        fn fields() -> &'static Fields {
            static FIELDS: std::sync::OnceLock<Fields> = std::sync::OnceLock::new();
            FIELDS.get_or_init(|| Fields {
                $($name: $crate::syntax::field_id($grammar, stringify!($name))),*
            })
        }
    };
}
pub(crate) use fields;

/// Why a source has no usable tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unparsed {
    /// The grammar rejected it; the byte offset and line of the first error.
    Syntax { line: u32, start: u32, end: u32 },
    /// Parsing ran out of its time budget (pathological input).
    Budget(Duration),
}

impl Unparsed {
    pub fn explain(&self) -> String {
        match self {
            Unparsed::Syntax { line, .. } => format!("it has a syntax error at line {line}"),
            Unparsed::Budget(d) => format!("parsing did not finish within {}ms", d.as_millis()),
        }
    }
}

thread_local! {
    /// Creating a parser and loading a grammar costs more than parsing a small snippet.
    static PARSERS: RefCell<[Option<Parser>; 3]> = const { RefCell::new([None, None, None]) };
}

/// Parses `source`, giving up after `budget`. A tree with errors counts as unparsed.
pub fn parse(grammar: Grammar, source: &str, budget: Duration) -> Result<Tree, Unparsed> {
    PARSERS.with(|cell| {
        let mut parsers = cell.borrow_mut();
        let parser = parsers[grammar.slot()].get_or_insert_with(|| {
            let mut p = Parser::new();
            p.set_language(&grammar.language())
                .expect("bundled grammar matches the tree-sitter ABI");
            p
        });
        let deadline = Instant::now() + budget;
        let mut ticks = 0u32;
        let mut progress = |_: &tree_sitter::ParseState| {
            // The callback runs every ~100 parser operations; reading the clock on every
            // 16th keeps the check cheap.
            ticks = ticks.wrapping_add(1);
            if ticks.is_multiple_of(16) && Instant::now() >= deadline {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        let bytes = source.as_bytes();
        let len = bytes.len();
        let tree = parser.parse_with_options(
            &mut |i, _| if i < len { &bytes[i..] } else { &[] },
            None,
            Some(ParseOptions::new().progress_callback(&mut progress)),
        );
        match tree {
            None => {
                // A cancelled parse would otherwise resume on the next call.
                parser.reset();
                Err(Unparsed::Budget(budget))
            }
            Some(tree) if tree.root_node().has_error() => Err(first_error(&tree)),
            Some(tree) => Ok(tree),
        }
    })
}

fn first_error(tree: &Tree) -> Unparsed {
    let mut found = None;
    walk(tree, |node, _| {
        if found.is_some() {
            return false;
        }
        if node.is_error() || node.is_missing() {
            found = Some(node);
            return false;
        }
        node.has_error()
    });
    let node = found.unwrap_or_else(|| tree.root_node());
    Unparsed::Syntax {
        line: line_of(node),
        start: node.start_byte() as u32,
        end: node.end_byte() as u32,
    }
}

/// Pre-order walk with a cursor. `visit(node, field)` returns whether to enter its children.
pub fn walk<'t>(tree: &'t Tree, mut visit: impl FnMut(Node<'t>, Option<&'static str>) -> bool) {
    walk_node(tree.root_node(), &mut visit);
}

/// The same walk below one node (the node included).
pub fn walk_node<'t>(
    root: Node<'t>,
    visit: &mut impl FnMut(Node<'t>, Option<&'static str>) -> bool,
) {
    let mut cursor = root.walk();
    loop {
        let descend = visit(cursor.node(), cursor.field_name());
        if descend && cursor.goto_first_child() {
            continue;
        }
        loop {
            if cursor.node() == root {
                return;
            }
            if cursor.goto_next_sibling() {
                break;
            }
            if !cursor.goto_parent() {
                return;
            }
        }
    }
}

/// 1-based line of a node.
pub fn line_of(node: Node) -> u32 {
    node.start_position().row as u32 + 1
}

/// 1-based line of a byte offset (for text matches, which have no node).
pub fn line_at(source: &str, offset: usize) -> u32 {
    let end = offset.min(source.len());
    source.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count() as u32
        + 1
}

pub fn text<'s>(node: Node, source: &'s str) -> &'s str {
    source.get(node.start_byte()..node.end_byte()).unwrap_or("")
}

/// An identifier as the language sees it. Python folds identifiers with NFKC (PEP 3131), so
/// `ｅｘｅｃ` *is* `exec`; JavaScript allows `\u0065val` for `eval`.
pub fn identifier(raw: &str, grammar: Grammar) -> String {
    match grammar {
        Grammar::Python if !raw.is_ascii() => raw.nfkc().collect(),
        Grammar::Javascript if raw.contains('\\') => decode_escapes(raw),
        _ => raw.to_string(),
    }
}

/// Decodes backslash escapes of Python/JavaScript string literals (the common forms; an
/// unknown escape stays as written).
pub fn decode_escapes(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(e) = chars.next() else {
            out.push('\\');
            break;
        };
        let hex = |chars: &mut std::iter::Peekable<std::str::Chars>, n: usize| {
            let digits: String = (0..n).filter_map(|_| chars.next()).collect();
            u32::from_str_radix(&digits, 16)
                .ok()
                .and_then(char::from_u32)
        };
        let decoded = match e {
            'n' => Some('\n'),
            't' => Some('\t'),
            'r' => Some('\r'),
            '0' => Some('\0'),
            '\\' | '\'' | '"' | '`' | '$' => Some(e),
            'x' => hex(&mut chars, 2),
            'u' if chars.peek() == Some(&'{') => {
                chars.next();
                let digits: String = chars.by_ref().take_while(|&c| c != '}').collect();
                u32::from_str_radix(&digits, 16)
                    .ok()
                    .and_then(char::from_u32)
            }
            'u' => hex(&mut chars, 4),
            'U' => hex(&mut chars, 8),
            '\n' => None,
            other => {
                out.push('\\');
                Some(other)
            }
        };
        if let Some(d) = decoded {
            out.push(d);
        }
    }
    out
}

/// Most parts a constant string expression may have before the assessor stops folding it.
const MAX_FOLD_PARTS: usize = 64;

/// The value of a constant string expression: literals joined by `+` (or Python's implicit
/// concatenation), in parentheses. `None` when any part is computed at run time. Iterative
/// with a bounded work list, so `'a'+'a'+...` a million times deep cannot overflow.
pub fn constant_string(node: Node, source: &str, grammar: Grammar) -> Option<String> {
    let mut out = String::new();
    let mut stack = vec![node];
    let mut parts = 0;
    while let Some(n) = stack.pop() {
        parts += 1;
        if parts > MAX_FOLD_PARTS {
            return None;
        }
        match n.kind() {
            "parenthesized_expression" => stack.push(n.named_child(0)?),
            "binary_operator" | "binary_expression" => {
                let op = n.child_by_field_name("operator")?;
                if text(op, source) != "+" {
                    return None;
                }
                // Right first so that the left part is popped (and appended) first.
                stack.push(n.child_by_field_name("right")?);
                stack.push(n.child_by_field_name("left")?);
            }
            "concatenated_string" => {
                let mut cursor = n.walk();
                let children: Vec<Node> = n.named_children(&mut cursor).collect();
                stack.extend(children.into_iter().rev());
            }
            "string" | "template_string" => out.push_str(&literal(n, source, grammar)?),
            _ => return None,
        }
    }
    Some(out)
}

/// The value of one string literal, `None` if it interpolates.
fn literal(node: Node, source: &str, grammar: Grammar) -> Option<String> {
    let mut cursor = node.walk();
    let mut prefix_raw = false;
    let mut content_start = node.start_byte();
    let mut content_end = node.end_byte();
    for child in node.children(&mut cursor) {
        match child.kind() {
            "interpolation" | "template_substitution" => return None,
            "string_start" => {
                let s = text(child, source);
                prefix_raw = s.contains(['r', 'R']);
                content_start = child.end_byte();
            }
            "string_end" => content_end = child.start_byte(),
            _ => {}
        }
    }
    if grammar == Grammar::Javascript {
        // `'...'`, `"..."`, `` `...` ``: one quote character on each side.
        content_start = node.start_byte() + 1;
        content_end = node.end_byte().saturating_sub(1).max(content_start);
    }
    let raw = source.get(content_start..content_end)?;
    Some(if prefix_raw {
        raw.to_string()
    } else {
        decode_escapes(raw)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_nesting_walks_without_recursion() {
        let source = "(".repeat(100_000) + &")".repeat(100_000);
        let tree = parse(Grammar::Python, &source, Duration::from_secs(30)).unwrap();
        let mut count = 0usize;
        walk(&tree, |_, _| {
            count += 1;
            true
        });
        assert!(count > 100_000);
    }

    #[test]
    fn an_exhausted_budget_is_reported_and_the_parser_recovers() {
        let source = "[".repeat(200_000);
        let err = parse(Grammar::Javascript, &source, Duration::ZERO).unwrap_err();
        assert_eq!(err, Unparsed::Budget(Duration::ZERO));
        assert!(parse(Grammar::Javascript, "let a = 1;", Duration::from_secs(5)).is_ok());
    }

    #[test]
    fn syntax_errors_carry_the_line() {
        let err = parse(Grammar::Python, "x = 1\ndef f(:\n", Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, Unparsed::Syntax { line: 2, .. }), "{err:?}");
    }

    #[test]
    fn constant_strings_fold_and_computed_ones_do_not() {
        let cases = [
            (Grammar::Python, "x = 'o' + \"s\"", Some("os")),
            (Grammar::Python, "x = ('ev' 'al')", Some("eval")),
            (Grammar::Python, "x = r'\\x41' + '\\x41'", Some("\\x41A")),
            (Grammar::Python, "x = 'o' + y", None),
            (Grammar::Python, "x = f'{y}'", None),
            (
                Grammar::Javascript,
                "x = 'child' + '_process'",
                Some("child_process"),
            ),
            (Grammar::Javascript, "x = `fs`", Some("fs")),
            (Grammar::Javascript, "x = `${a}`", None),
        ];
        for (grammar, source, want) in cases {
            let tree = parse(grammar, source, Duration::from_secs(5)).unwrap();
            let mut got = None;
            walk(&tree, |node, field| {
                if matches!(field, Some("right")) && got.is_none() {
                    got = Some(constant_string(node, source, grammar));
                    return false;
                }
                true
            });
            assert_eq!(got.flatten().as_deref(), want, "{source}");
        }
    }

    #[test]
    fn identifiers_are_folded_like_the_language_does() {
        assert_eq!(identifier("ｅｘｅｃ", Grammar::Python), "exec");
        assert_eq!(identifier("\\u0065val", Grammar::Javascript), "eval");
        assert_eq!(identifier("\\u{65}val", Grammar::Javascript), "eval");
    }
}
