//! Python facts from a tree-sitter tree: imports (`import os`, `from subprocess import run`,
//! `__import__('os')`, `importlib.import_module('os')`), calls and references with names
//! resolved through imports and simple aliases (`from os import system as s; s()` calls
//! `os.system`; `e = eval; e(...)` calls `eval`).

use std::collections::HashMap;

use tree_sitter::{Node, Tree};

use crate::code::{name_forms, Facts, Named};
use crate::syntax::{self, Grammar};

const G: Grammar = Grammar::Python;
/// Routes to a builtin or a module that are the same as naming it.
const PREFIXES: &[&str] = &[
    "__builtins__.",
    "builtins.",
    "sys.modules.",
    "globals.",
    "vars.",
];
/// Longest attribute chain resolved; longer ones end in `?` (bounded work on hostile input).
const MAX_CHAIN: usize = 32;

syntax::fields!(G; attribute, object, subscript, value, function, arguments);
/// Calls whose first argument names a module to load.
const IMPORT_CALLS: &[&str] = &[
    "__import__",
    "importlib.import_module",
    "importlib.__import__",
];

pub fn facts<'t>(tree: &'t Tree, source: &str) -> Facts<'t> {
    let mut facts = Facts::default();
    let mut aliases: HashMap<String, String> = HashMap::new();
    let mut calls = Vec::new();
    let mut refs = Vec::new();
    let mut assignments = Vec::new();
    syntax::walk(tree, |node, field| match node.kind() {
        "import_statement" => {
            import(node, source, &mut facts, &mut aliases);
            false
        }
        "import_from_statement" => {
            import_from(node, source, &mut facts, &mut aliases);
            false
        }
        "call" => {
            calls.push(node);
            true
        }
        "attribute" => {
            refs.push(node);
            true
        }
        // A name after a dot, a keyword, or a definition's name is not a reference.
        "identifier" if !matches!(field, Some("attribute" | "name" | "alias")) => {
            refs.push(node);
            false
        }
        "assignment" => {
            let (left, right) = (
                node.child_by_field_name("left"),
                node.child_by_field_name("right"),
            );
            if let (Some(l), Some(r)) = (left, right) {
                if l.kind() == "identifier" && matches!(r.kind(), "identifier" | "attribute") {
                    assignments.push((l, r));
                }
            }
            true
        }
        _ => true,
    });
    // Aliases by assignment see the imports, and each other in source order.
    for (left, right) in assignments {
        let name = syntax::identifier(syntax::text(left, source), G);
        let target = qualified(right, source, &aliases);
        if !target.contains('?') && target != name {
            aliases.insert(name, target);
        }
    }
    for call in calls {
        let Some(callee) = call.child_by_field_id(fields().function) else {
            continue;
        };
        let names = name_forms(qualified(callee, source, &aliases), PREFIXES);
        let args = call.child_by_field_id(fields().arguments);
        if names.iter().any(|n| IMPORT_CALLS.contains(&n.as_str())) {
            let first = args.and_then(|a| a.named_child(0));
            if let Some(module) = first.and_then(|f| syntax::constant_string(f, source, G)) {
                facts.imports.push((module, call));
            }
        }
        facts.calls.push(Named {
            node: call,
            names,
            args,
        });
    }
    for node in refs {
        let names = name_forms(qualified(node, source, &aliases), PREFIXES);
        facts.refs.push(Named {
            node,
            names,
            args: None,
        });
    }
    facts
}

/// `import a.b as c, d`: binds `c` → `a.b`, `d` → `d`; `import a.b` binds `a` → `a`.
fn import<'t>(
    node: Node<'t>,
    source: &str,
    facts: &mut Facts<'t>,
    aliases: &mut HashMap<String, String>,
) {
    let mut cursor = node.walk();
    for name in node.children_by_field_name("name", &mut cursor) {
        let (module, alias) = match name.kind() {
            "aliased_import" => (
                name.child_by_field_name("name").map(|n| dotted(n, source)),
                name.child_by_field_name("alias").map(|n| dotted(n, source)),
            ),
            _ => (Some(dotted(name, source)), None),
        };
        let Some(module) = module else { continue };
        match alias {
            Some(alias) => aliases.insert(alias, module.clone()),
            None => {
                let head = module.split('.').next().unwrap_or(&module).to_string();
                aliases.insert(head.clone(), head)
            }
        };
        facts.imports.push((module, node));
    }
}

/// `from a.b import c as d, e`: binds `d` → `a.b.c`, `e` → `a.b.e`.
fn import_from<'t>(
    node: Node<'t>,
    source: &str,
    facts: &mut Facts<'t>,
    aliases: &mut HashMap<String, String>,
) {
    let Some(module) = node
        .child_by_field_name("module_name")
        .map(|m| dotted(m, source))
    else {
        return;
    };
    let mut cursor = node.walk();
    for name in node.children_by_field_name("name", &mut cursor) {
        let (member, alias) = match name.kind() {
            "aliased_import" => (
                name.child_by_field_name("name").map(|n| dotted(n, source)),
                name.child_by_field_name("alias").map(|n| dotted(n, source)),
            ),
            _ => (Some(dotted(name, source)), None),
        };
        let Some(member) = member else { continue };
        let bound = alias.unwrap_or_else(|| member.clone());
        aliases.insert(bound, format!("{module}.{member}"));
    }
    facts.imports.push((module, node));
}

/// A dotted name with each part folded like Python folds identifiers.
fn dotted(node: Node, source: &str) -> String {
    syntax::text(node, source)
        .split('.')
        .map(|part| syntax::identifier(part.trim(), G))
        .collect::<Vec<_>>()
        .join(".")
}

fn resolve(name: String, aliases: &HashMap<String, String>) -> String {
    // Alias chains are followed a few steps; a cycle (`a = b; b = a`) just stops.
    let mut current = name;
    for _ in 0..8 {
        let Some(next) = aliases.get(&current) else {
            break;
        };
        if *next == current {
            break;
        }
        current = next.clone();
    }
    current
}

/// The dotted name an expression denotes: `sp.run` → `subprocess.run`,
/// `getattr(__builtins__, 'ev' + 'al')` → `__builtins__.eval`, `x['k']` → `x.k`. Parts that
/// are computed become `?`. Iterative: a chain of any length costs at most `MAX_CHAIN` steps.
pub fn qualified(node: Node, source: &str, aliases: &HashMap<String, String>) -> String {
    let f = fields();
    let mut parts: Vec<String> = Vec::new();
    let mut current = node;
    for _ in 0..MAX_CHAIN {
        match current.kind() {
            "identifier" => {
                let name = syntax::identifier(syntax::text(current, source), G);
                parts.push(resolve(name, aliases));
                return join(parts);
            }
            "attribute" => {
                let attr = current.child_by_field_id(f.attribute);
                let object = current.child_by_field_id(f.object);
                let (Some(attr), Some(object)) = (attr, object) else {
                    break;
                };
                parts.push(syntax::identifier(syntax::text(attr, source), G));
                current = object;
            }
            "subscript" => {
                let key = current
                    .child_by_field_id(f.subscript)
                    .and_then(|k| syntax::constant_string(k, source, G));
                let Some(value) = current.child_by_field_id(f.value) else {
                    break;
                };
                parts.push(key.unwrap_or_else(|| "?".into()));
                current = value;
            }
            "parenthesized_expression" => match current.named_child(0) {
                Some(inner) => current = inner,
                None => break,
            },
            "call" if is_getattr(current, source, aliases) => {
                let args = current.child_by_field_id(f.arguments);
                let object = args.and_then(|a| a.named_child(0));
                let attr = args
                    .and_then(|a| a.named_child(1))
                    .and_then(|n| syntax::constant_string(n, source, G));
                let Some(object) = object else { break };
                parts.push(attr.unwrap_or_else(|| "?".into()));
                current = object;
            }
            _ => break,
        }
    }
    parts.push("?".into());
    join(parts)
}

fn is_getattr(call: Node, source: &str, aliases: &HashMap<String, String>) -> bool {
    let callee = call.child_by_field_id(fields().function);
    callee.is_some_and(|c| {
        c.kind() == "identifier"
            && resolve(syntax::identifier(syntax::text(c, source), G), aliases) == "getattr"
    })
}

fn join(mut parts: Vec<String>) -> String {
    parts.reverse();
    parts.join(".")
}
