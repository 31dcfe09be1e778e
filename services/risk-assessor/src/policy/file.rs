//! The policy file's shape (`[shell]` tables and `[[rules]]` entries, complete or partial) and
//! its compilation into checked `Rule`s: regexes compiled, matchers valid for the language,
//! `unparsed` rules never disabled.

use std::collections::BTreeMap;

use messages::risk::RiskLevel;
use regex::Regex;
use serde::Deserialize;
use toml::Spanned;

use super::{ArgCheck, Detector, Language, Rule};
use crate::glob::Glob;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyFile {
    #[serde(default)]
    pub(super) shell: Option<ShellSpec>,
    #[serde(default)]
    pub(super) rules: Vec<Spanned<RuleSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ShellSpec {
    pub(super) safe_commands: Option<Vec<String>>,
    #[serde(default)]
    pub(super) add_safe_commands: Vec<String>,
    #[serde(default)]
    pub(super) remove_safe_commands: Vec<String>,
    pub(super) unsafe_options: Option<BTreeMap<String, Vec<String>>>,
    pub(super) wrappers: Option<NameList>,
    pub(super) options_with_value: Option<BTreeMap<String, Vec<String>>>,
    pub(super) command_options: Option<BTreeMap<String, Vec<String>>>,
    pub(super) interpreters: Option<NameList>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NameList {
    pub(super) names: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ArgSpec {
    position: Option<usize>,
    keyword: Option<String>,
    matches: String,
    #[serde(default)]
    when_absent: bool,
}

/// One `[[rules]]` entry: complete for a new rule, partial for an override.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleSpec {
    pub(super) id: String,
    pub(super) language: Option<Language>,
    pub(super) severity: Option<RiskLevel>,
    pub(super) description: Option<String>,
    pub(super) source: Option<String>,
    pub(super) enabled: Option<bool>,
    pub(super) pattern: Option<String>,
    pub(super) text: Option<String>,
    pub(super) calls: Option<Vec<String>>,
    pub(super) refs: Option<Vec<String>>,
    pub(super) imports: Option<Vec<String>>,
    pub(super) news: Option<Vec<String>>,
    pub(super) modules: Option<Vec<String>>,
    pub(super) commands: Option<Vec<String>>,
    pub(super) actions: Option<Vec<String>>,
    pub(super) flags: Option<Vec<String>>,
    pub(super) args: Option<String>,
    pub(super) args_text: Option<String>,
    pub(super) arg: Option<ArgSpec>,
    pub(super) subcommand: Option<String>,
    pub(super) redirect: Option<String>,
    pub(super) redirect_except: Option<String>,
    pub(super) pipe_from: Option<Vec<String>>,
    pub(super) pipe_to: Option<Vec<String>>,
    pub(super) detector: Option<Detector>,
    /// A network fetch: at most `low` when the code runs under a network policy.
    pub(super) fetches: Option<bool>,
}

macro_rules! overlay_fields {
    ($base:expr, $over:expr; $($f:ident),*) => {
        $( if $over.$f.is_some() { $base.$f = $over.$f.clone(); } )*
    };
}

impl RuleSpec {
    pub(super) fn apply(&mut self, over: &RuleSpec) {
        overlay_fields!(self, over; language, severity, description, source, enabled, pattern,
            text, calls, refs, imports, news, modules, commands, actions, flags, args, args_text,
            arg, subcommand, redirect, redirect_except, pipe_from, pipe_to, detector, fetches);
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
        Language::Javascript => &["calls", "news", "modules", "refs", "arg", "args_text"],
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
        Language::File => &[],
    }
}

pub(super) fn compile(spec: RuleSpec) -> Result<Rule, String> {
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
    if matches!(spec.detector, Some(Detector::Unparsed | Detector::Opaque)) && !enabled {
        // Code that does not parse, and a file that cannot be read, must never come out SAFE.
        return Err(ctx(format!(
            "the `{}` rule cannot be disabled (re-grade it instead)",
            if spec.detector == Some(Detector::Opaque) {
                "opaque"
            } else {
                "unparsed"
            }
        )));
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
        fetches: spec.fetches.unwrap_or(false),
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
