//! The risk policy as data: rules with stable ids, severities and matchers. The default
//! (`policy/default.toml`, embedded at build time) reproduces the seeds; an overlay file named
//! by `SANDMESH_RISK_POLICY` adds, disables or re-grades rules without a rebuild. Every error in
//! a policy file names its line.

use std::collections::{BTreeMap, BTreeSet};

use messages::risk::RiskLevel;
use regex::Regex;
use serde::Deserialize;

use crate::glob::Glob;

mod file;

use file::{compile, PolicyFile, RuleSpec, ShellSpec};

/// The default policy, as shipped.
pub const DEFAULT_POLICY: &str = include_str!("../../policy/default.toml");

/// What a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Python,
    Javascript,
    Shell,
    Browser,
    /// Files sent with a request, as files (what cannot be read as code).
    File,
}

/// Structural checks that are code, not patterns; a rule names one to grade or disable it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Detector {
    /// The source does not parse.
    Unparsed,
    /// A shell function that starts copies of itself.
    ForkBomb,
    /// A shell command whose name is computed at run time.
    DynamicCommand,
    /// Command or process substitution.
    Substitution,
    /// Any redirection not already graded by a `redirect` rule.
    Redirection,
    /// A shell command not on the safe list (or used with an unsafe option).
    NotAllowlisted,
    /// A file of a request that cannot be read as code.
    Opaque,
}

#[derive(Debug, thiserror::Error)]
#[error("{origin} line {line}: {message}")]
pub struct PolicyError {
    /// The file: `default policy` or the overlay's path.
    pub origin: String,
    pub line: usize,
    pub message: String,
}

/// A condition on one argument of a Python call: the argument at `position` or named
/// `keyword` must be a string literal matching `matches`. A computed value counts as a match
/// (the assessor cannot rule it out); a missing argument counts when `when_absent`.
#[derive(Debug, Clone)]
pub struct ArgCheck {
    pub position: Option<usize>,
    pub keyword: Option<String>,
    pub matches: Regex,
    pub when_absent: bool,
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    pub id: String,
    pub language: Language,
    pub severity: RiskLevel,
    pub description: String,
    pub source: String,
    pub enabled: bool,
    /// A network fetch (requests, urllib, fetch, ...): under a network policy the policy is
    /// the boundary, so it counts at most `low` there.
    pub fetches: bool,
    pub pattern: Option<Regex>,
    pub text: Option<Regex>,
    pub calls: Vec<Glob>,
    pub refs: Vec<Glob>,
    pub imports: Vec<String>,
    pub news: Vec<Glob>,
    pub modules: Vec<Glob>,
    pub commands: Vec<Glob>,
    pub actions: Vec<Glob>,
    /// Every group must be present; a group is satisfied by any of its spellings.
    pub flags: Vec<Vec<String>>,
    pub args: Option<Regex>,
    pub args_text: Option<Regex>,
    pub arg: Option<ArgCheck>,
    pub subcommand: Option<String>,
    pub redirect: Option<Regex>,
    pub redirect_except: Option<Regex>,
    pub pipe_from: Vec<Glob>,
    pub pipe_to: Vec<Glob>,
    pub detector: Option<Detector>,
}

/// Shell-specific tables.
#[derive(Debug, Clone, Default)]
pub struct ShellTables {
    pub safe_commands: BTreeSet<String>,
    pub unsafe_options: BTreeMap<String, Vec<String>>,
    /// Commands that run their arguments as a command (`sudo`, `xargs`, ...).
    pub wrappers: BTreeSet<String>,
    /// Command → its options that take the next word as a value.
    pub options_with_value: BTreeMap<String, Vec<String>>,
    /// Command → its options whose following words are a command it runs (`find -exec`).
    pub command_options: BTreeMap<String, Vec<String>>,
    /// Shells whose `-c` argument is a script.
    pub interpreters: BTreeSet<String>,
}

/// The compiled policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub shell: ShellTables,
}

// === impl Policy ===

impl Policy {
    /// The default policy; it is part of the build, so a failure is a bug caught by tests.
    pub fn default_policy() -> Self {
        Self::load(None).expect("the embedded default policy is valid")
    }

    /// The default policy with an optional overlay `(origin, text)` applied.
    pub fn load(overlay: Option<(&str, &str)>) -> Result<Self, PolicyError> {
        let base = parse_file("default policy", DEFAULT_POLICY)?;
        let mut specs: Vec<(String, usize, RuleSpec)> = Vec::new();
        let mut shell = ShellTables::default();
        apply_shell(&mut shell, base.shell);
        for r in base.rules {
            let line = line_of(DEFAULT_POLICY, r.span().start);
            let spec = r.into_inner();
            if specs.iter().any(|(_, _, s)| s.id == spec.id) {
                return Err(error(
                    "default policy",
                    line,
                    format!("duplicate rule {}", spec.id),
                ));
            }
            specs.push(("default policy".into(), line, spec));
        }
        if let Some((origin, text)) = overlay {
            let file = parse_file(origin, text)?;
            apply_shell(&mut shell, file.shell);
            for r in file.rules {
                let line = line_of(text, r.span().start);
                let over = r.into_inner();
                match specs.iter_mut().find(|(_, _, s)| s.id == over.id) {
                    Some(slot) => {
                        slot.2.apply(&over);
                        slot.0 = origin.to_string();
                        slot.1 = line;
                    }
                    None => specs.push((origin.to_string(), line, over)),
                }
            }
        }
        let rules = specs
            .into_iter()
            .map(|(origin, line, spec)| compile(spec).map_err(|m| error(&origin, line, m)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { rules, shell })
    }

    pub fn rule(&self, id: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.id == id)
    }

    /// The enabled rules for one language, with their index in `rules`.
    pub fn rules_for(&self, language: Language) -> impl Iterator<Item = (usize, &Rule)> {
        self.rules
            .iter()
            .enumerate()
            .filter(move |(_, r)| r.enabled && r.language == language)
    }
}

fn error(origin: &str, line: usize, message: impl Into<String>) -> PolicyError {
    PolicyError {
        origin: origin.to_string(),
        line,
        message: message.into(),
    }
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn parse_file(origin: &str, text: &str) -> Result<PolicyFile, PolicyError> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(1);
        error(origin, line, e.message().to_string())
    })
}

fn apply_shell(tables: &mut ShellTables, spec: Option<ShellSpec>) {
    let Some(spec) = spec else { return };
    if let Some(list) = spec.safe_commands {
        tables.safe_commands = list.into_iter().collect();
    }
    tables.safe_commands.extend(spec.add_safe_commands);
    for c in spec.remove_safe_commands {
        tables.safe_commands.remove(&c);
    }
    if let Some(map) = spec.unsafe_options {
        tables.unsafe_options.extend(map);
    }
    if let Some(list) = spec.wrappers {
        tables.wrappers = list.names.into_iter().collect();
    }
    if let Some(map) = spec.options_with_value {
        tables.options_with_value.extend(map);
    }
    if let Some(map) = spec.command_options {
        tables.command_options.extend(map);
    }
    if let Some(i) = spec.interpreters {
        tables.interpreters = i.names.into_iter().collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_policy_compiles_with_unique_ids() {
        let p = Policy::default_policy();
        let ids: BTreeSet<_> = p.rules.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids.len(), p.rules.len());
        assert!(p.shell.safe_commands.contains("ls"));
        assert!(p.shell.wrappers.contains("sudo"));
    }

    #[test]
    fn an_overlay_regrades_disables_and_adds() {
        let overlay = r#"
[shell]
add_safe_commands = ["jq"]

[[rules]]
id = "py.read"
severity = "low"

[[rules]]
id = "sh.mv"
enabled = false

[[rules]]
id = "py.yaml_load"
language = "python"
severity = "high"
description = "yaml.load can build arbitrary objects"
calls = ["yaml.load"]
"#;
        let p = Policy::load(Some(("overlay.toml", overlay))).unwrap();
        assert_eq!(p.rule("py.read").unwrap().severity, RiskLevel::Low);
        assert!(!p.rule("sh.mv").unwrap().enabled);
        assert_eq!(p.rule("py.yaml_load").unwrap().severity, RiskLevel::High);
        assert!(p.shell.safe_commands.contains("jq"));
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let cases = [
            ("[[rules]]\nid = \"x\"\nseverity = \"extreme\"\n", 3),
            ("\n\n[[rules]]\nid = \"py.x\"\nlanguage = \"python\"\n", 3),
            ("[[rules]]\nid = \"py.eval\"\n\n[[rules]]\nid = \"py.eval\"\ntext = '('\n", 4),
            ("[[rules]]\nid = \"py.eval\"\nbogus = 1\n", 3),
            ("[[rules]]\nid = \"py.unparsed\"\nenabled = false\n", 1),
            ("[[rules]]\nid = \"sh.x\"\nlanguage = \"shell\"\nseverity = \"low\"\ndescription = \"d\"\ncalls = [\"x\"]\n", 1),
        ];
        for (text, line) in cases {
            let e = Policy::load(Some(("o.toml", text))).unwrap_err();
            assert_eq!((e.origin.as_str(), e.line), ("o.toml", line), "{text}: {e}");
        }
    }
}
