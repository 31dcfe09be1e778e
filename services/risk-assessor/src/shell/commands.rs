//! Commands as the shell runs them: through wrappers (`sudo -u root env X=1 rm` runs rm), with
//! their flags, arguments and subcommand, and pipeline stages by name.

use tree_sitter::Node;

use super::words::{basename, command_words, Word};
use crate::glob;
use crate::policy::{Policy, Rule};

/// Start indices of the commands a command line runs: itself, the command each wrapper runs
/// (`sudo -u root env X=1 rm -rf /` runs sudo, env and rm), and the command a command option
/// runs (`find . -exec rm {} ;` runs find and rm).
pub fn invocations(words: &[Word], policy: &Policy) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut pending = vec![0];
    // Every start found lies after the one it was found from, so this ends.
    while let Some(start) = pending.pop() {
        for s in wrapped(words, start, policy) {
            pending.extend(run_by_options(words, s, policy));
            starts.push(s);
        }
    }
    starts.sort_unstable();
    starts.dedup();
    starts
}

/// The command at `start` and, while it is a wrapper, the command it wraps.
fn wrapped(words: &[Word], start: usize, policy: &Policy) -> Vec<usize> {
    let mut starts = vec![start];
    let mut i = start;
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

/// Where the commands run by the options of the command at `start` begin (`-exec CMD`).
fn run_by_options(words: &[Word], start: usize, policy: &Policy) -> Vec<usize> {
    let Some(options) = words[start]
        .value
        .as_deref()
        .and_then(|name| policy.shell.command_options.get(basename(name)))
    else {
        return Vec::new();
    };
    (start + 1..words.len().saturating_sub(1))
        .filter(|&i| {
            words[i]
                .value
                .as_deref()
                .is_some_and(|v| options.iter().any(|o| o == v))
        })
        .map(|i| i + 1)
        .collect()
}

/// Flags, argument pattern and subcommand conditions of a command rule.
pub fn command_conditions(
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

pub fn describe(name: &str, args: &[Word], source: &str) -> String {
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
pub fn stage_names(stage: Node, source: &str, policy: &Policy) -> Vec<String> {
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
pub fn piped(stages: &[Vec<String>], from: &[glob::Glob], to: &[glob::Glob]) -> bool {
    let first_from = stages
        .iter()
        .position(|names| names.iter().any(|n| glob::any(from, n)));
    first_from.is_some_and(|i| {
        stages[i + 1..]
            .iter()
            .any(|names| names.iter().any(|n| glob::any(to, n)))
    })
}
