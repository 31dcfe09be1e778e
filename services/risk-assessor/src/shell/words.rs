//! Shell words evaluated statically: quotes and escapes removed (`r''m`, `r\m` and
//! `$'\x72\x6d'` are all `rm`), anything expanded at run time (`$x`, `$(...)`) left unknown,
//! and unquoted globs or brace lists marked as expanding.

use tree_sitter::Node;

use crate::syntax;

/// One word of a command: its static value when it has one (no expansion inside).
#[derive(Debug, Clone)]
pub struct Word<'t> {
    pub node: Node<'t>,
    pub value: Option<String>,
    /// Unquoted glob or brace characters: the shell would expand it.
    pub expands: bool,
}

impl Word<'_> {
    /// The value, or the source text when it is computed (`$HOME` stays `$HOME`).
    pub fn shown<'a>(&'a self, source: &'a str) -> &'a str {
        self.value
            .as_deref()
            .unwrap_or_else(|| syntax::text(self.node, source))
    }
}

/// The name and argument words of a command (assignments like `X=1 cmd` are skipped). One
/// cursor pass: commands with a hundred thousand arguments stay linear.
pub fn command_words<'t>(node: Node<'t>, source: &str) -> Vec<Word<'t>> {
    let mut words = Vec::new();
    let mut cursor = node.walk();
    if cursor.goto_first_child() {
        loop {
            if matches!(cursor.field_name(), Some("name" | "argument")) {
                words.push(word(cursor.node(), source));
            }
            if !cursor.goto_next_sibling() {
                break;
            }
        }
    }
    words
}

/// The static value of a word, `None` when any part is expanded at run time.
pub fn word<'t>(node: Node<'t>, source: &str) -> Word<'t> {
    let mut expands = false;
    let value = value(node, source, &mut expands, 0);
    Word {
        node,
        value,
        expands,
    }
}

fn value(node: Node, source: &str, expands: &mut bool, depth: u8) -> Option<String> {
    if depth > 8 {
        return None;
    }
    let raw = syntax::text(node, source);
    match node.kind() {
        "command_name" => value(node.named_child(0)?, source, expands, depth + 1),
        "word" | "number" => {
            let has_brace_list = raw.contains('{') && raw.contains(',');
            if raw.contains(['*', '?', '[']) || has_brace_list {
                *expands = true;
            }
            Some(unescape(raw))
        }
        "raw_string" => Some(raw.get(1..raw.len().saturating_sub(1))?.to_string()),
        "ansi_c_string" => Some(ansi_c(raw.get(2..raw.len().saturating_sub(1))?)),
        "string" => {
            let mut cursor = node.walk();
            let computed = node
                .named_children(&mut cursor)
                .any(|c| c.kind() != "string_content");
            if computed {
                return None;
            }
            let inner = raw.get(1..raw.len().saturating_sub(1))?;
            Some(unescape_double_quoted(inner))
        }
        "concatenation" => {
            let mut cursor = node.walk();
            let parts: Vec<Node> = node.named_children(&mut cursor).collect();
            let mut out = String::new();
            for part in parts {
                out.push_str(&value(part, source, expands, depth + 1)?);
            }
            Some(out)
        }
        _ => None,
    }
}

/// An unquoted word: a backslash keeps the next character literally.
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    if n != '\n' {
                        out.push(n);
                    }
                }
            }
            c => out.push(c),
        }
    }
    out
}

fn unescape_double_quoted(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('\\', Some(&n)) if matches!(n, '$' | '`' | '"' | '\\' | '\n') => {
                chars.next();
                if n != '\n' {
                    out.push(n);
                }
            }
            (c, _) => out.push(c),
        }
    }
    out
}

/// `$'...'`: C escapes, including octal `\162` and hex `\x72`.
fn ansi_c(raw: &str) -> String {
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
        let mut number = |first: Option<char>, radix: u32, max: usize| {
            let digits: String = first
                .into_iter()
                .chain(std::iter::from_fn(|| chars.next_if(|c| c.is_digit(radix))))
                .take(max)
                .collect();
            u32::from_str_radix(&digits, radix)
                .ok()
                .and_then(char::from_u32)
        };
        let decoded = match e {
            'n' => Some('\n'),
            't' => Some('\t'),
            'r' => Some('\r'),
            'a' => Some('\x07'),
            'b' => Some('\x08'),
            'e' | 'E' => Some('\x1b'),
            'f' => Some('\x0c'),
            'v' => Some('\x0b'),
            '\\' | '\'' | '"' | '?' => Some(e),
            '0'..='7' => number(Some(e), 8, 3),
            'x' => number(None, 16, 2),
            'u' => number(None, 16, 4),
            'U' => number(None, 16, 8),
            other => {
                out.push('\\');
                Some(other)
            }
        };
        out.extend(decoded);
    }
    out
}

pub fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::syntax::{parse, Grammar};

    fn name_of(script: &str) -> (Option<String>, bool) {
        let tree = parse(Grammar::Bash, script, Duration::from_secs(5)).unwrap();
        let mut found = None;
        syntax::walk(&tree, |node, _| {
            if node.kind() == "command" && found.is_none() {
                let w = &command_words(node, script)[0];
                found = Some((w.value.clone(), w.expands));
            }
            true
        });
        found.unwrap()
    }

    #[test]
    fn quotes_and_escapes_are_removed_and_expansions_are_unknown() {
        let cases = [
            ("r''m x", Some("rm"), false),
            ("r\\m x", Some("rm"), false),
            ("w\"h\"o\"am\"i", Some("whoami"), false),
            ("$'\\x72\\x6d' x", Some("rm"), false),
            ("$'\\162\\155' x", Some("rm"), false),
            ("\"/bin/ls\" -la", Some("/bin/ls"), false),
            ("$a$b x", None, false),
            ("who$@ami", None, false),
            ("/???/?m x", Some("/???/?m"), true),
        ];
        for (script, value, expands) in cases {
            let (v, e) = name_of(script);
            assert_eq!((v.as_deref(), e), (value, expands), "{script}");
        }
    }
}
