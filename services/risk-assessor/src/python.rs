//! Python facts from a tree-sitter tree: imports (`import os`, `from subprocess import run`,
//! `__import__('os')`, `importlib.import_module('os')`), calls and references with names
//! resolved through imports and simple aliases (`from os import system as s; s()` calls
//! `os.system`; `e = eval; e(...)` calls `eval`).
//!
//! Modules hand out the modules they import as attributes (`pty.os`, `tempfile._os`,
//! `linecache.os`), so a chain that reaches a dangerous module through another one is named as
//! that module (`linecache.os.system` is `os.system`) and counts as importing it.

use std::collections::{HashMap, HashSet};

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
/// Modules that run programs or reach the interpreter's internals, by the attribute names other
/// modules keep them under (`tempfile` imports `os as _os`), and the module each one is.
const REACHABLE: &[(&str, &str)] = &[
    ("os", "os"),
    ("_os", "os"),
    ("nt", "os"),
    ("posix", "posix"),
    ("subprocess", "subprocess"),
    ("_subprocess", "subprocess"),
    ("_posixsubprocess", "_posixsubprocess"),
    ("sys", "sys"),
    ("_sys", "sys"),
    ("pty", "pty"),
    ("ctypes", "ctypes"),
    ("_ctypes", "ctypes"),
    ("importlib", "importlib"),
    ("_imp", "_imp"),
    ("runpy", "runpy"),
    ("shutil", "shutil"),
    ("_shutil", "shutil"),
    ("builtins", "builtins"),
    ("_builtins", "builtins"),
];
/// Calls that return their argument's namespace: `vars(m)['os']` is `m.os`.
const NAMESPACE_CALLS: &[&str] = &["vars"];

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
    // Node ids of the callees of calls (asking a node for its parent walks from the root).
    let mut callees = HashSet::new();
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
            callees.extend(node.child_by_field_id(fields().function).map(|c| c.id()));
            calls.push(node);
            true
        }
        // `x.y` and `x['y']`: a computed key is a reference worth judging too.
        "attribute" | "subscript" => {
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
                let names_something = matches!(
                    r.kind(),
                    "identifier" | "attribute" | "subscript" | "call" | "parenthesized_expression"
                );
                if l.kind() == "identifier" && names_something {
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
    // Names resolve through the import aliases to the modules' own names.
    let modules: HashSet<String> = facts
        .imports
        .iter()
        .filter_map(|(m, _)| m.split('.').next())
        .map(str::to_string)
        .collect();
    let mut reached = Vec::new();
    for call in calls {
        let Some(callee) = call.child_by_field_id(fields().function) else {
            continue;
        };
        let names = names_of(callee, source, &aliases, &modules, &mut reached);
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
            callee: false,
        });
    }
    for node in refs {
        let names = names_of(node, source, &aliases, &modules, &mut reached);
        let callee = callees.contains(&node.id());
        facts.refs.push(Named {
            node,
            names,
            args: None,
            callee,
        });
    }
    facts.imports.extend(reached);
    facts
}

/// The names an expression goes by, the module reached through another module's attribute
/// included; such a module counts as imported where it is reached.
fn names_of<'t>(
    node: Node<'t>,
    source: &str,
    aliases: &HashMap<String, String>,
    modules: &HashSet<String>,
    reached: &mut Vec<(String, Node<'t>)>,
) -> Vec<String> {
    let written = qualified(node, source, aliases);
    let through = through_module(&written, modules);
    let mut names = name_forms(written, PREFIXES);
    if let Some((module, name)) = through {
        reached.push((module.to_string(), node));
        for form in name_forms(name, PREFIXES) {
            if !names.contains(&form) {
                names.push(form);
            }
        }
    }
    names
}

/// `linecache.os.system` → (`os`, `os.system`): the last part after the first that names a
/// module of [`REACHABLE`], and the chain from there. When the chain starts at a module (or at
/// something computed, such as `__import__(...)` or `vars(m)`) any such part counts, `m.os`
/// included; from an ordinary value (`row.os`) only a part that is used as a module
/// (`row.os.system`), so a field that happens to be called `os` stays data.
fn through_module(name: &str, modules: &HashSet<String>) -> Option<(&'static str, String)> {
    let root = name.split('.').next().unwrap_or(name);
    let from_module = root == "?" || modules.contains(root);
    // (the module, where the chain after it starts); parts are scanned in place, no copies.
    let mut found = None;
    let mut start = root.len() + 1;
    while start <= name.len() {
        let end = name[start..].find('.').map_or(name.len(), |i| start + i);
        let used_as_module = end < name.len();
        if from_module || used_as_module {
            let part = &name[start..end];
            if let Some((_, module)) = REACHABLE.iter().find(|(attr, _)| *attr == part) {
                found = Some((*module, end));
            }
        }
        start = end + 1;
    }
    let (module, end) = found?;
    Some((module, format!("{module}{}", &name[end..])))
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
            "call" if calls_one_of(current, source, aliases, NAMESPACE_CALLS) => {
                // `vars(m)[k]` is `m.__dict__[k]`, which is `m.k`.
                match current
                    .child_by_field_id(f.arguments)
                    .and_then(|a| a.named_child(0))
                {
                    Some(object) => current = object,
                    None => break,
                }
            }
            "call" if calls_one_of(current, source, aliases, &["globals", "locals"]) => {
                // `globals()['eval']` names `eval` as `globals.eval`.
                parts.push("globals".into());
                return join(parts);
            }
            "call" if calls_one_of(current, source, aliases, &["getattr"]) => {
                let args = current.child_by_field_id(f.arguments);
                let object = args.and_then(|a| a.named_child(0));
                let attr = args
                    .and_then(|a| a.named_child(1))
                    .and_then(|n| syntax::constant_string(n, source, G));
                let Some(object) = object else { break };
                parts.push(attr.unwrap_or_else(|| "?".into()));
                current = object;
            }
            // `__import__('os')` and `importlib.import_module('os')` are the module loaded.
            "call" => match loaded_module(current, source, aliases) {
                Some(module) => {
                    parts.push(module);
                    return join(parts);
                }
                None => break,
            },
            _ => break,
        }
    }
    parts.push("?".into());
    join(parts)
}

/// The module an import call with a constant name loads (`__import__('o' + 's')` → `os`).
fn loaded_module(call: Node, source: &str, aliases: &HashMap<String, String>) -> Option<String> {
    let f = fields();
    let callee = call.child_by_field_id(f.function)?;
    let name = |n: Node| resolve(syntax::identifier(syntax::text(n, source), G), aliases);
    let callee = match callee.kind() {
        "identifier" => name(callee),
        "attribute" => {
            let object = callee.child_by_field_id(f.object)?;
            let attr = callee.child_by_field_id(f.attribute)?;
            if object.kind() != "identifier" {
                return None;
            }
            format!("{}.{}", name(object), syntax::text(attr, source))
        }
        _ => return None,
    };
    if !IMPORT_CALLS.contains(&callee.as_str()) {
        return None;
    }
    let first = call.child_by_field_id(f.arguments)?.named_child(0)?;
    syntax::constant_string(first, source, G)
}

/// Whether `call` calls one of the builtins `names` (possibly under an alias).
fn calls_one_of(
    call: Node,
    source: &str,
    aliases: &HashMap<String, String>,
    names: &[&str],
) -> bool {
    let callee = call.child_by_field_id(fields().function);
    callee.is_some_and(|c| {
        c.kind() == "identifier"
            && names.contains(
                &resolve(syntax::identifier(syntax::text(c, source), G), aliases).as_str(),
            )
    })
}

fn join(mut parts: Vec<String>) -> String {
    parts.reverse();
    parts.join(".")
}
