//! What the Python and JavaScript analysers extract from a tree — imports, calls,
//! constructions, references, each with its resolved names — and how rules match those facts.

use tree_sitter::Node;

use crate::glob;
use crate::hits::Hits;
use crate::policy::{ArgCheck, Language, Policy, Rule};
use crate::syntax::{self, Grammar};

/// A call, a `new`, or a reference, with the names it resolves to: the name as written after
/// alias resolution, and its canonical form (`__builtins__.eval` → `eval`).
#[derive(Debug)]
pub struct Named<'t> {
    pub node: Node<'t>,
    pub names: Vec<String>,
    /// For calls: the argument list node.
    pub args: Option<Node<'t>>,
    /// For references: it is the callee of a call, which the call itself stands for.
    pub callee: bool,
}

#[derive(Debug, Default)]
pub struct Facts<'t> {
    /// Modules loaded, by name as written (`os.path`, `node:fs`), with the loading node.
    pub imports: Vec<(String, Node<'t>)>,
    pub calls: Vec<Named<'t>>,
    pub news: Vec<Named<'t>>,
    pub refs: Vec<Named<'t>>,
}

/// Whether `module` is `pattern` or one of its submodules (`os` covers `os.path`).
fn module_matches(pattern: &str, module: &str) -> bool {
    module == pattern
        || module
            .strip_prefix(pattern)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// Libraries that drive a browser (by import rather than by any
/// mention of the word): code loading one is suggested tier `aio`, which has a browser.
const BROWSER_MODULES: &[&str] = &[
    // Python
    "selenium",
    "playwright",
    "pyppeteer",
    "splinter",
    "undetected_chromedriver",
    "helium",
    "DrissionPage",
    // JavaScript
    "puppeteer",
    "puppeteer-core",
    "playwright-core",
    "@playwright/test",
    "selenium-webdriver",
    "chrome-remote-interface",
    "webdriverio",
];

/// Whether the code imports a browser automation library.
pub fn needs_browser(facts: &Facts) -> bool {
    facts.imports.iter().any(|(module, _)| {
        let module = module.strip_prefix("node:").unwrap_or(module);
        BROWSER_MODULES.iter().any(|p| {
            module_matches(p, module)
                || module
                    .strip_prefix(p)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    })
}

fn names_match(globs: &[glob::Glob], names: &[String]) -> bool {
    names.iter().any(|n| glob::any(globs, n))
}

/// Applies every enabled rule of `language` to the facts.
pub fn apply(
    facts: &Facts,
    source: &str,
    policy: &Policy,
    language: Language,
    grammar: Grammar,
    hits: &mut Hits,
) {
    for (index, rule) in policy.rules_for(language) {
        if !rule.imports.is_empty() {
            for (module, node) in &facts.imports {
                if rule.imports.iter().any(|p| module_matches(p, module)) {
                    hits.add(index, *node, Some(format!("imports {module}")));
                }
            }
        }
        if !rule.modules.is_empty() {
            for (module, node) in &facts.imports {
                if glob::any(&rule.modules, module) {
                    hits.add(index, *node, Some(format!("loads {module}")));
                }
            }
        }
        if !rule.calls.is_empty() {
            for call in &facts.calls {
                if names_match(&rule.calls, &call.names)
                    && conditions_hold(rule, call, source, grammar)
                {
                    hits.add(index, call.node, Some(format!("calls {}", call.names[0])));
                }
            }
        }
        if !rule.news.is_empty() {
            for new in &facts.news {
                if names_match(&rule.news, &new.names) {
                    hits.add(index, new.node, Some(format!("new {}", new.names[0])));
                }
            }
        }
        if !rule.refs.is_empty() {
            // A rule that judges calls (with their arguments) judges a callee as that call;
            // its `refs` are then the other uses: `e = eval`, `[eval][0](...)`.
            let calls_judged = !rule.calls.is_empty();
            for r in facts.refs.iter().filter(|r| !(calls_judged && r.callee)) {
                if names_match(&rule.refs, &r.names) {
                    hits.add(index, r.node, Some(format!("uses {}", r.names[0])));
                }
            }
        }
        if let Some(pattern) = &rule.pattern {
            hits.add_regex(index, pattern, source, 0);
        }
    }
}

fn conditions_hold(rule: &Rule, call: &Named, source: &str, grammar: Grammar) -> bool {
    if let Some(re) = &rule.args_text {
        let args = call.args.map(|a| syntax::text(a, source)).unwrap_or("");
        if !re.is_match(args) {
            return false;
        }
    }
    match (&rule.arg, call.args) {
        (None, _) => true,
        (Some(check), Some(args)) => arg_holds(check, args, source, grammar),
        (Some(check), None) => check.when_absent,
    }
}

/// Finds the argument by keyword or position. A computed value or a splat (`*a`, `**kw`) might
/// be anything, so it counts as a match: the assessor errs towards the higher grade.
fn arg_holds(check: &ArgCheck, args: Node, source: &str, grammar: Grammar) -> bool {
    let mut cursor = args.walk();
    let mut position = 0usize;
    let mut splat = false;
    for child in args.named_children(&mut cursor) {
        let value = match child.kind() {
            "keyword_argument" => {
                let name = child.child_by_field_name("name");
                let is_it =
                    name.is_some_and(|n| Some(syntax::text(n, source)) == check.keyword.as_deref());
                if !is_it {
                    continue;
                }
                child.child_by_field_name("value")
            }
            "list_splat" | "dictionary_splat" | "spread_element" => {
                splat = true;
                continue;
            }
            "comment" => continue,
            _ => {
                position += 1;
                if Some(position - 1) != check.position {
                    continue;
                }
                Some(child)
            }
        };
        let Some(value) = value else { return true };
        return match syntax::constant_string(value, source, grammar) {
            Some(s) => check.matches.is_match(&s),
            None => true,
        };
    }
    splat || check.when_absent
}

/// Canonical forms of a dotted name: reaching a builtin through `__builtins__`, `builtins`,
/// `sys.modules[...]`, `globalThis`, `window`, ... is the same as naming it.
pub fn canonical(name: &str, prefixes: &[&str]) -> String {
    let mut current = name;
    'strip: loop {
        for p in prefixes {
            if let Some(rest) = current.strip_prefix(p) {
                if !rest.is_empty() {
                    current = rest;
                    continue 'strip;
                }
            }
        }
        return current.to_string();
    }
}

/// `[as written, canonical]`, without a duplicate.
pub fn name_forms(written: String, prefixes: &[&str]) -> Vec<String> {
    let c = canonical(&written, prefixes);
    if c == written {
        vec![written]
    } else {
        vec![written, c]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submodules_match_their_package_only() {
        assert!(module_matches("os", "os"));
        assert!(module_matches("os", "os.path"));
        assert!(!module_matches("os", "osmosis"));
        assert!(module_matches("http.client", "http.client"));
        assert!(!module_matches("http.client", "http"));
    }

    #[test]
    fn canonical_names_strip_every_route_to_a_builtin() {
        let p = ["__builtins__.", "builtins.", "sys.modules."];
        assert_eq!(canonical("__builtins__.eval", &p), "eval");
        assert_eq!(canonical("sys.modules.os.system", &p), "os.system");
        assert_eq!(canonical("__builtins__", &p), "__builtins__");
    }
}
