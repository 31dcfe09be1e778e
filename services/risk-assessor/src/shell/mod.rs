//! Shell scripts judged as the pipelines they are. Every command is evaluated to its static
//! name and arguments (quotes and escapes removed: `r''m` is `rm`), looked through wrappers
//! (`sudo`, `xargs`, `env`, ...) and into `sh -c '...'` / `eval '...'` scripts; pipelines,
//! redirections, substitutions and self-spawning functions are checked structurally. A script
//! is SAFE only when nothing fired: every command of every pipeline on the safe list, and no
//! redirection, substitution, eval or computed command name.

use tree_sitter::{Node, Tree};

use crate::glob;
use crate::hits::Hits;
use crate::policy::{Detector, Language, Policy, Rule};
use crate::syntax;

mod commands;
mod fork_bomb;
mod words;

use commands::{command_conditions, describe, invocations, piped, stage_names};
use fork_bomb::ForkBombs;
use words::{basename, command_words, word, Word};

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
                self.hit(rule, node, Some(format!("`{keyword}`")));
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
            return Some(format!("`{name}`"));
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
