//! The risk policy as data: rules with stable ids, severities and matchers. The default
//! (`policy/default.toml`, embedded at build time) reproduces the seeds; an overlay file named
//! by `SANDMESH_RISK_POLICY` adds, disables or re-grades rules without a rebuild. Every error in
//! a policy file names its line.

use std::collections::{BTreeMap, BTreeSet};

use messages::risk::RiskLevel;
use regex::Regex;
use serde::Deserialize;
use toml::Spanned;

use crate::glob::Glob;

/// The default policy, as shipped.
pub const DEFAULT_POLICY: &str = include_str!("../policy/default.toml");

/// What a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Python,
    Javascript,
    Shell,
    Browser,
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
    /// Shells whose `-c` argument is a script.
    pub interpreters: BTreeSet<String>,
}

/// The compiled policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub shell: ShellTables,
}

// === file shape ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    shell: Option<ShellSpec>,
    #[serde(default)]
    rules: Vec<Spanned<RuleSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellSpec {
    safe_commands: Option<Vec<String>>,
    #[serde(default)]
    add_safe_commands: Vec<String>,
    #[serde(default)]
    remove_safe_commands: Vec<String>,
    unsafe_options: Option<BTreeMap<String, Vec<String>>>,
    wrappers: Option<NameList>,
    options_with_value: Option<BTreeMap<String, Vec<String>>>,
    interpreters: Option<NameList>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NameList {
    names: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ArgSpec {
    position: Option<usize>,
    keyword: Option<String>,
    matches: String,
    #[serde(default)]
    when_absent: bool,
}

/// One `[[rules]]` entry: complete for a new rule, partial for an override.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    id: String,
    language: Option<Language>,
    severity: Option<RiskLevel>,
    description: Option<String>,
    source: Option<String>,
    enabled: Option<bool>,
    pattern: Option<String>,
    text: Option<String>,
    calls: Option<Vec<String>>,
    refs: Option<Vec<String>>,
    imports: Option<Vec<String>>,
    news: Option<Vec<String>>,
    modules: Option<Vec<String>>,
    commands: Option<Vec<String>>,
    actions: Option<Vec<String>>,
    flags: Option<Vec<String>>,
    args: Option<String>,
    args_text: Option<String>,
    arg: Option<ArgSpec>,
    subcommand: Option<String>,
    redirect: Option<String>,
    redirect_except: Option<String>,
    pipe_from: Option<Vec<String>>,
    pipe_to: Option<Vec<String>>,
    detector: Option<Detector>,
}

macro_rules! overlay_fields {
    ($base:expr, $over:expr; $($f:ident),*) => {
        $( if $over.$f.is_some() { $base.$f = $over.$f.clone(); } )*
    };
}

impl RuleSpec {
    fn apply(&mut self, over: &RuleSpec) {
        overlay_fields!(self, over; language, severity, description, source, enabled, pattern,
            text, calls, refs, imports, news, modules, commands, actions, flags, args, args_text,
            arg, subcommand, redirect, redirect_except, pipe_from, pipe_to, detector);
    }
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
    if let Some(i) = spec.interpreters {
        tables.interpreters = i.names.into_iter().collect();
    }
}

fn regex(field: &str, pattern: &Option<String>) -> Result<Option<Regex>, String> {
    pattern
        .as_deref()
        .map(|p| Regex::new(p).map_err(|e| format!("{field}: invalid regex {p:?}: {e}")))
        .transpose()
}

fn globs(list: &Option<Vec<String>>) -> Vec<Glob> {
    list.iter().flatten().map(|g| Glob::new(g)).collect()
}

/// Which matcher fields each language understands; any other is a mistake worth reporting.
fn allowed(language: Language) -> &'static [&'static str] {
    match language {
        Language::Python => &["calls", "refs", "imports", "arg", "args_text"],
        Language::Javascript => &["calls", "news", "modules", "refs"],
        Language::Shell => &[
            "commands",
            "flags",
            "args",
            "subcommand",
            "redirect",
            "redirect_except",
            "pipe_from",
            "pipe_to",
        ],
        Language::Browser => &["actions"],
    }
}

fn compile(spec: RuleSpec) -> Result<Rule, String> {
    let id = spec.id.clone();
    let valid_id = !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !valid_id {
        return Err(format!(
            "rule id {id:?}: use letters, digits, '.', '_', '-'"
        ));
    }
    let ctx = |m: String| format!("rule {id}: {m}");
    let language = spec
        .language
        .ok_or_else(|| ctx("a new rule needs `language`".into()))?;
    let severity = spec
        .severity
        .ok_or_else(|| ctx("a new rule needs `severity`".into()))?;
    if severity == RiskLevel::Safe {
        return Err(ctx("severity must be low, medium, high or critical".into()));
    }
    let description = spec
        .description
        .clone()
        .ok_or_else(|| ctx("a new rule needs `description`".into()))?;
    let present: Vec<&str> = [
        ("calls", spec.calls.is_some()),
        ("refs", spec.refs.is_some()),
        ("imports", spec.imports.is_some()),
        ("news", spec.news.is_some()),
        ("modules", spec.modules.is_some()),
        ("commands", spec.commands.is_some()),
        ("actions", spec.actions.is_some()),
        ("flags", spec.flags.is_some()),
        ("args", spec.args.is_some()),
        ("args_text", spec.args_text.is_some()),
        ("arg", spec.arg.is_some()),
        ("subcommand", spec.subcommand.is_some()),
        ("redirect", spec.redirect.is_some()),
        ("redirect_except", spec.redirect_except.is_some()),
        ("pipe_from", spec.pipe_from.is_some()),
        ("pipe_to", spec.pipe_to.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if let Some(bad) = present.iter().find(|f| !allowed(language).contains(f)) {
        return Err(ctx(format!("`{bad}` does not apply to {language:?} rules")));
    }
    let conditions = [
        "flags",
        "args",
        "subcommand",
        "arg",
        "args_text",
        "redirect_except",
    ];
    let matchers = present.iter().filter(|f| !conditions.contains(f)).count();
    if matchers == 0 && spec.pattern.is_none() && spec.detector.is_none() {
        return Err(ctx("needs a matcher (calls, commands, pattern, ...)".into()));
    }
    if spec.pipe_from.is_some() != spec.pipe_to.is_some() {
        return Err(ctx("`pipe_from` and `pipe_to` go together".into()));
    }
    let enabled = spec.enabled.unwrap_or(true);
    if spec.detector == Some(Detector::Unparsed) && !enabled {
        // Code that does not parse must never come out SAFE.
        return Err(ctx(
            "the `unparsed` rule cannot be disabled (re-grade it instead)".into(),
        ));
    }
    let arg = match &spec.arg {
        None => None,
        Some(a) => Some(ArgCheck {
            position: a.position,
            keyword: a.keyword.clone(),
            matches: regex("arg.matches", &Some(a.matches.clone()))
                .map_err(ctx)?
                .expect("present"),
            when_absent: a.when_absent,
        }),
    };
    Ok(Rule {
        language,
        severity,
        description,
        source: spec.source.clone().unwrap_or_else(|| "user policy".into()),
        enabled,
        pattern: regex("pattern", &spec.pattern).map_err(ctx)?,
        text: regex("text", &spec.text).map_err(ctx)?,
        calls: globs(&spec.calls),
        refs: globs(&spec.refs),
        imports: spec.imports.clone().unwrap_or_default(),
        news: globs(&spec.news),
        modules: globs(&spec.modules),
        commands: globs(&spec.commands),
        actions: globs(&spec.actions),
        flags: spec
            .flags
            .iter()
            .flatten()
            .map(|g| g.split('|').map(str::to_string).collect())
            .collect(),
        args: regex("args", &spec.args).map_err(ctx)?,
        args_text: regex("args_text", &spec.args_text).map_err(ctx)?,
        arg,
        subcommand: spec.subcommand.clone(),
        redirect: regex("redirect", &spec.redirect).map_err(ctx)?,
        redirect_except: regex("redirect_except", &spec.redirect_except).map_err(ctx)?,
        pipe_from: globs(&spec.pipe_from),
        pipe_to: globs(&spec.pipe_to),
        detector: spec.detector,
        id,
    })
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
