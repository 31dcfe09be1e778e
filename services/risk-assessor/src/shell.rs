//! Shell scripts judged as the pipelines they are. Every command is evaluated to its static
//! name and arguments (quotes and escapes removed: `r''m` is `rm`), looked through wrappers
//! (`sudo`, `xargs`, `env`, ...) and into `sh -c '...'` / `eval '...'` scripts; pipelines,
//! redirections, substitutions and self-spawning functions are checked structurally. A script
//! is SAFE only when nothing fired: every command of every pipeline on the safe list, and no
//! redirection, substitution, eval or computed command name.

use std::collections::HashMap;

use tree_sitter::{Node, Tree};

use crate::glob;
use crate::hits::Hits;
use crate::policy::{Detector, Language, Policy, Rule};
use crate::syntax;

/// How deep `sh -c` / `eval` scripts are followed.
pub const MAX_NESTING: u8 = 3;

/// Where a (possibly embedded) script sits in the assessed content.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    pub offset: usize,
    pub line: u32,
    pub depth: u8,
}

impl Origin {
    pub const TOP: Origin = Origin {
        offset: 0,
        line: 1,
        depth: 0,
    };
}

/// One word of a command: its static value when it has one (no expansion inside).
#[derive(Debug, Clone)]
struct Word<'t> {
    node: Node<'t>,
    value: Option<String>,
    /// Unquoted glob or brace characters: the shell would expand it.
    expands: bool,
}

impl Word<'_> {
    /// The value, or the source text when it is computed (`$HOME` stays `$HOME`).
    fn shown<'a>(&'a self, source: &'a str) -> &'a str {
        self.value
            .as_deref()
            .unwrap_or_else(|| syntax::text(self.node, source))
    }
}

/// The analysis of one script: a tree, the policy, and where hits go.
pub struct Analysis<'a, 'p> {
    pub source: &'a str,
    pub policy: &'p Policy,
    pub hits: &'a mut Hits,
    pub origin: Origin,
    /// Called for embedded scripts (`sh -c`, `eval`) that need their own parse.
    pub nested: &'a mut dyn FnMut(&str, Origin, &mut Hits),
}

impl Analysis<'_, '_> {
    fn rules(&self) -> impl Iterator<Item = (usize, &Rule)> {
        self.policy.rules_for(Language::Shell)
    }

    fn detector(&self, d: Detector) -> Option<usize> {
        self.rules()
            .find(|(_, r)| r.detector == Some(d))
            .map(|(i, _)| i)
    }

    fn hit(&mut self, rule: usize, node: Node, detail: Option<String>) {
        let line = self.origin.line + syntax::line_of(node) - 1;
        let (start, end) = (node.start_byte(), node.end_byte());
        let o = self.origin.offset;
        self.hits.add_span(rule, line, o + start, o + end, detail);
    }

    fn covered(&self, node: Node) -> bool {
        let o = self.origin.offset;
        self.hits.covers(o + node.start_byte(), o + node.end_byte())
    }

    pub fn run(&mut self, tree: &Tree) {
        let mut commands = Vec::new();
        let mut redirects = Vec::new();
        let mut functions = ForkBombs::default();
        let substitution = self.detector(Detector::Substitution);
        let mut substitutions = Vec::new();
        let mut pipelines = Vec::new();
        syntax::walk(tree, |node, _| {
            functions.leave_before(node.start_byte());
            match node.kind() {
                "command" => commands.push(node),
                "declaration_command" | "unset_command" => commands.push(node),
                "pipeline" => pipelines.push(node),
                "file_redirect" | "heredoc_redirect" | "herestring_redirect" => {
                    redirects.push(node)
                }
                "command_substitution" | "process_substitution" => substitutions.push(node),
                "function_definition" => functions.enter(node, self.source),
                _ => {}
            }
            if node.kind() == "command" {
                if let Some(name) = node.child_by_field_name("name") {
                    functions.called(&word(name, self.source).value.unwrap_or_default());
                }
            }
            true
        });
        for command in commands {
            self.command(command);
        }
        for pipeline in pipelines {
            self.pipeline(pipeline);
        }
        for redirect in redirects {
            self.redirect(redirect);
        }
        if let Some(rule) = substitution {
            for node in substitutions {
                self.hit(rule, node, None);
            }
        }
        if let Some(rule) = self.detector(Detector::ForkBomb) {
            for (node, name) in functions.bombs() {
                self.hit(
                    rule,
                    node,
                    Some(format!("function {name} calls itself twice")),
                );
            }
        }
        let rules: Vec<(usize, regex::Regex)> = self
            .rules()
            .filter_map(|(i, r)| r.pattern.clone().map(|p| (i, p)))
            .collect();
        for (index, pattern) in rules {
            self.hits
                .add_regex(index, &pattern, self.source, self.origin.offset);
        }
    }

    fn command(&mut self, node: Node) {
        let words = command_words(node, self.source);
        if node.kind() != "command" {
            // `export`, `local`, `unset`, ...: builtins off the safe list.
            if let Some(rule) = self.detector(Detector::NotAllowlisted) {
                let keyword = node
                    .child(0)
                    .map(|k| syntax::text(k, self.source))
                    .unwrap_or("");
                self.hit(
                    rule,
                    node,
                    Some(format!("`{keyword}` is not on the safe list")),
                );
            }
            return;
        }
        if words.is_empty() {
            return;
        }
        let invocations = invocations(&words, self.policy);
        let mut unsafe_reason: Option<String> = None;
        let mut dynamic = false;
        for &start in &invocations {
            let (name_word, args) = (&words[start], &words[start + 1..]);
            let name = match (&name_word.value, name_word.expands) {
                (Some(v), false) => basename(v).to_string(),
                _ => {
                    dynamic = true;
                    continue;
                }
            };
            let matched: Vec<(usize, String)> = self
                .rules()
                .filter(|(_, r)| !r.commands.is_empty() && glob::any(&r.commands, &name))
                .filter(|(_, r)| command_conditions(r, &name, args, self.source, self.policy))
                .map(|(i, _)| (i, describe(&name, args, self.source)))
                .collect();
            for (rule, detail) in matched {
                self.hit(rule, node, Some(detail));
            }
            if unsafe_reason.is_none() {
                unsafe_reason = self.not_safe(&name, args);
            }
            self.embedded(&name, args);
        }
        if dynamic {
            if let Some(rule) = self.detector(Detector::DynamicCommand) {
                let shown = syntax::text(words[0].node, self.source).to_string();
                self.hit(
                    rule,
                    node,
                    Some(format!("command name `{shown}` is computed")),
                );
            }
        }
        if let (Some(reason), false) = (unsafe_reason, self.covered(node)) {
            if let Some(rule) = self.detector(Detector::NotAllowlisted) {
                self.hit(rule, node, Some(reason));
            }
        }
    }

    /// Why this invocation is not a safe command, if it is not.
    fn not_safe(&self, name: &str, args: &[Word]) -> Option<String> {
        let tables = &self.policy.shell;
        if !tables.safe_commands.contains(name) {
            return Some(format!("`{name}` is not on the safe list"));
        }
        let options = tables.unsafe_options.get(name)?;
        args.iter()
            .map(|a| a.shown(self.source))
            .find(|a| {
                options
                    .iter()
                    .any(|o| a == o || a.starts_with(&format!("{o}=")))
            })
            .map(|a| format!("`{name} {a}` can write or run other programs"))
    }

    /// `sh -c 'script'` and `eval 'script'`: the embedded script is assessed too.
    fn embedded(&mut self, name: &str, args: &[Word]) {
        let script: Option<(String, Node)> = if name == "eval" {
            let values: Option<Vec<String>> = args.iter().map(|a| a.value.clone()).collect();
            values.and_then(|v| Some((v.join(" "), args.first()?.node)))
        } else if self.policy.shell.interpreters.contains(name) {
            let dash_c = args.iter().position(|a| {
                a.value
                    .as_deref()
                    .is_some_and(|v| v.starts_with('-') && !v.starts_with("--") && v.contains('c'))
            });
            match dash_c.and_then(|i| args.get(i + 1)) {
                Some(w) => w.value.clone().map(|v| (v, w.node)),
                None => None,
            }
        } else {
            None
        };
        let Some((script, node)) = script else { return };
        if self.origin.depth >= MAX_NESTING {
            return;
        }
        let quoted = matches!(node.kind(), "raw_string" | "string" | "ansi_c_string");
        let origin = Origin {
            offset: self.origin.offset + node.start_byte() + usize::from(quoted),
            line: self.origin.line + syntax::line_of(node) - 1,
            depth: self.origin.depth + 1,
        };
        (self.nested)(&script, origin, self.hits);
    }

    fn pipeline(&mut self, node: Node) {
        let mut cursor = node.walk();
        let stages: Vec<Vec<String>> = node
            .named_children(&mut cursor)
            .map(|stage| stage_names(stage, self.source, self.policy))
            .collect();
        let rules: Vec<usize> = self
            .rules()
            .filter(|(_, r)| !r.pipe_from.is_empty())
            .filter(|(_, r)| piped(&stages, &r.pipe_from, &r.pipe_to))
            .map(|(i, _)| i)
            .collect();
        for rule in rules {
            self.hit(rule, node, None);
        }
    }

    fn redirect(&mut self, node: Node) {
        let mut writes_file = false;
        let mut target = String::new();
        if node.kind() == "file_redirect" {
            let mut cursor = node.walk();
            let operator = node
                .children(&mut cursor)
                .find(|c| !c.is_named())
                .map(|c| syntax::text(c, self.source))
                .unwrap_or("");
            if let Some(dest) = node.child_by_field_name("destination") {
                let dest = word(dest, self.source);
                target = dest.shown(self.source).to_string();
                // `>&2` duplicates a descriptor; it writes no file.
                let dup =
                    operator.ends_with('&') && (target == "-" || target.parse::<u32>().is_ok());
                writes_file = operator.contains('>') && !dup;
            }
        }
        if writes_file {
            let matched: Vec<usize> = self
                .rules()
                .filter(|(_, r)| r.redirect.as_ref().is_some_and(|re| re.is_match(&target)))
                .filter(|(_, r)| {
                    !r.redirect_except
                        .as_ref()
                        .is_some_and(|re| re.is_match(&target))
                })
                .map(|(i, _)| i)
                .collect();
            for rule in matched {
                self.hit(rule, node, Some(format!("writes {target}")));
            }
        }
        if !self.covered(node) {
            if let Some(rule) = self.detector(Detector::Redirection) {
                self.hit(rule, node, None);
            }
        }
    }
}

/// The name and argument words of a command (assignments like `X=1 cmd` are skipped). One
/// cursor pass: commands with a hundred thousand arguments stay linear.
fn command_words<'t>(node: Node<'t>, source: &str) -> Vec<Word<'t>> {
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
fn word<'t>(node: Node<'t>, source: &str) -> Word<'t> {
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

fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// Start indices of the commands a command line runs: itself, and the command each wrapper
/// runs (`sudo -u root env X=1 rm -rf /` runs sudo, env and rm).
fn invocations(words: &[Word], policy: &Policy) -> Vec<usize> {
    let mut starts = vec![0];
    let mut i = 0;
    while let Some(name) = words[i].value.as_deref().map(basename) {
        if !policy.shell.wrappers.contains(name) {
            break;
        }
        let with_value = policy.shell.options_with_value.get(name);
        let mut j = i + 1;
        while let Some(w) = words.get(j) {
            let Some(v) = w.value.as_deref() else { break };
            if v == "--" {
                j += 1;
                break;
            }
            let is_option = v.starts_with('-') && v.len() > 1;
            let is_setting = v.contains('=') && !v.starts_with('=');
            let is_amount = v
                .trim_end_matches(['s', 'm', 'h', 'd'])
                .parse::<f64>()
                .is_ok();
            if is_option && with_value.is_some_and(|o| o.iter().any(|o| o == v)) {
                j += 2;
            } else if is_option || is_setting || is_amount {
                j += 1;
            } else {
                break;
            }
        }
        if j >= words.len() {
            break;
        }
        starts.push(j);
        i = j;
    }
    starts
}

/// Flags, argument pattern and subcommand conditions of a command rule.
fn command_conditions(
    rule: &Rule,
    name: &str,
    args: &[Word],
    source: &str,
    policy: &Policy,
) -> bool {
    let mut shorts = String::new();
    let mut longs: Vec<&str> = Vec::new();
    let mut positional: Vec<&str> = Vec::new();
    let with_value = policy.shell.options_with_value.get(name);
    let mut skip_next = false;
    let mut options_done = false;
    for a in args {
        let v = a.shown(source);
        if skip_next {
            skip_next = false;
            continue;
        }
        if options_done || !v.starts_with('-') || v == "-" {
            positional.push(v);
        } else if v == "--" {
            options_done = true;
        } else if let Some(long) = v.strip_prefix("--") {
            longs.push(long.split('=').next().unwrap_or(long));
        } else {
            shorts.push_str(&v[1..]);
            skip_next = with_value.is_some_and(|o| o.iter().any(|o| o == v));
        }
    }
    let flags_ok = rule.flags.iter().all(|group| {
        group.iter().any(|flag| match flag.strip_prefix("--") {
            Some(long) => longs.contains(&long),
            None => flag
                .strip_prefix('-')
                .is_some_and(|s| s.len() == 1 && shorts.contains(s)),
        })
    });
    let args_ok = rule
        .args
        .as_ref()
        .is_none_or(|re| args.iter().any(|a| re.is_match(a.shown(source))));
    let sub_ok = rule
        .subcommand
        .as_ref()
        .is_none_or(|s| positional.first() == Some(&s.as_str()));
    flags_ok && args_ok && sub_ok
}

fn describe(name: &str, args: &[Word], source: &str) -> String {
    let mut text = name.to_string();
    for a in args.iter().take(6) {
        text.push(' ');
        text.push_str(a.shown(source));
    }
    if text.len() > 120 {
        let cut = (0..=120)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// The command names one pipeline stage runs (`?` for a computed name).
fn stage_names(stage: Node, source: &str, policy: &Policy) -> Vec<String> {
    let command = match stage.kind() {
        "command" => stage,
        "redirected_statement" => match stage.child_by_field_name("body") {
            Some(b) if b.kind() == "command" => b,
            _ => return vec!["?".into()],
        },
        _ => return vec!["?".into()],
    };
    let words = command_words(command, source);
    if words.is_empty() {
        return vec![];
    }
    invocations(&words, policy)
        .into_iter()
        .map(|i| match (&words[i].value, words[i].expands) {
            (Some(v), false) => basename(v).to_string(),
            _ => "?".into(),
        })
        .collect()
}

/// Whether a stage matching `from` comes before a later stage matching `to`.
fn piped(stages: &[Vec<String>], from: &[glob::Glob], to: &[glob::Glob]) -> bool {
    let first_from = stages
        .iter()
        .position(|names| names.iter().any(|n| glob::any(from, n)));
    first_from.is_some_and(|i| {
        stages[i + 1..]
            .iter()
            .any(|names| names.iter().any(|n| glob::any(to, n)))
    })
}

/// Functions being walked and how often each calls itself: two calls (`:|:`) is a fork bomb.
#[derive(Default)]
struct ForkBombs<'t> {
    /// Enclosing functions: (end byte, name, index in `found`).
    open: Vec<(usize, String, usize)>,
    /// Name → indices of enclosing functions with that name (innermost last).
    by_name: HashMap<String, Vec<usize>>,
    found: Vec<(Node<'t>, String, u32)>,
}

impl<'t> ForkBombs<'t> {
    fn enter(&mut self, node: Node<'t>, source: &str) {
        let Some(name) = node.child_by_field_name("name") else {
            return;
        };
        let name = word(name, source).value.unwrap_or_default();
        let index = self.found.len();
        self.found.push((node, name.clone(), 0));
        self.open.push((node.end_byte(), name.clone(), index));
        self.by_name.entry(name).or_default().push(index);
    }

    fn leave_before(&mut self, start: usize) {
        while let Some((end, _, _)) = self.open.last() {
            if *end > start {
                break;
            }
            let (_, name, _) = self.open.pop().expect("checked");
            if let Some(stack) = self.by_name.get_mut(&name) {
                stack.pop();
            }
        }
    }

    fn called(&mut self, name: &str) {
        if let Some(&index) = self.by_name.get(name).and_then(|s| s.last()) {
            self.found[index].2 += 1;
        }
    }

    fn bombs(self) -> impl Iterator<Item = (Node<'t>, String)> {
        self.found
            .into_iter()
            .filter(|(_, _, calls)| *calls >= 2)
            .map(|(node, name, _)| (node, name))
    }
}
