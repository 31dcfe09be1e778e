//! JavaScript facts from a tree-sitter tree: modules loaded (`require('fs')`, `import ... from
//! 'fs'`, `export ... from`, dynamic `import('fs')`), calls, `new` expressions and member
//! references, with names resolved through simple aliases (`const e = eval`) and global
//! objects (`globalThis['ev' + 'al']` is `eval`; `\u0065val` is `eval`).

use std::collections::{HashMap, HashSet};

use tree_sitter::{Node, Tree};

use crate::code::{name_forms, Facts, Named};
use crate::syntax::{self, Grammar};

const G: Grammar = Grammar::Javascript;
const PREFIXES: &[&str] = &["globalThis.", "window.", "global.", "self.", "this."];
const MAX_CHAIN: usize = 32;
/// Calls that load a module by the name in their first argument: `require`, dynamic `import()`,
/// and the loader reached around `require` (`module.constructor._load` is `Module._load`).
const LOADERS: &[&str] = &[
    "require",
    "import",
    "module.require",
    "module.constructor._load",
    "module.constructor.require",
    "require.main.require",
    "process.mainModule.require",
    "process.mainModule.constructor._load",
];

syntax::fields!(G; property, object, index);

pub fn facts<'t>(tree: &'t Tree, source: &str) -> Facts<'t> {
    let mut facts = Facts::default();
    let mut aliases: HashMap<String, String> = HashMap::new();
    let mut calls = Vec::new();
    let mut news = Vec::new();
    let mut refs = Vec::new();
    let mut declarations = Vec::new();
    // Node ids of the callees of calls (asking a node for its parent walks from the root).
    let mut callees = HashSet::new();
    syntax::walk(tree, |node, field| {
        match node.kind() {
            "import_statement" | "export_statement" => {
                let module = node
                    .child_by_field_name("source")
                    .and_then(|s| syntax::constant_string(s, source, G));
                if let Some(module) = module {
                    facts.imports.push((module, node));
                }
            }
            "call_expression" => {
                callees.extend(node.child_by_field_name("function").map(|c| c.id()));
                calls.push(node);
            }
            "new_expression" => news.push(node),
            "member_expression" | "subscript_expression" => refs.push(node),
            "identifier" if field != Some("property") => refs.push(node),
            "variable_declarator" | "assignment_expression" => {
                let left = node
                    .child_by_field_name("name")
                    .or_else(|| node.child_by_field_name("left"));
                let right = node
                    .child_by_field_name("value")
                    .or_else(|| node.child_by_field_name("right"));
                if let (Some(l), Some(r)) = (left, right) {
                    let aliasing = matches!(
                        r.kind(),
                        "identifier"
                            | "member_expression"
                            | "subscript_expression"
                            | "parenthesized_expression"
                    );
                    if aliasing {
                        bindings(l, r, source, &mut declarations);
                    }
                }
            }
            _ => {}
        }
        true
    });
    for (name, right, member) in declarations {
        let mut target = qualified(right, source, &aliases);
        if let Some(member) = member {
            target = format!("{target}.{member}");
        }
        if !target.contains('?') && target != name {
            aliases.insert(name, target);
        }
    }
    for call in calls {
        let callee = call.child_by_field_name("function");
        let args = call.child_by_field_name("arguments");
        let first = args
            .and_then(|a| a.named_child(0))
            .and_then(|f| syntax::constant_string(f, source, G));
        let names = match callee {
            Some(c) if c.kind() == "import" => vec!["import".to_string()],
            Some(c) => name_forms(qualified(c, source, &aliases), PREFIXES),
            None => continue,
        };
        if names.iter().any(|n| LOADERS.contains(&n.as_str())) {
            if let Some(module) = first {
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
    for new in news {
        let Some(constructor) = new.child_by_field_name("constructor") else {
            continue;
        };
        facts.news.push(Named {
            node: new,
            names: name_forms(qualified(constructor, source, &aliases), PREFIXES),
            args: new.child_by_field_name("arguments"),
            callee: false,
        });
    }
    for node in refs {
        let callee = callees.contains(&node.id());
        facts.refs.push(Named {
            node,
            names: name_forms(qualified(node, source, &aliases), PREFIXES),
            args: None,
            callee,
        });
    }
    facts
}

/// The names a declaration binds, each with the expression it takes and the member of it:
/// `const e = eval` binds `e` to `eval`; `const { binding, dlopen: d } = process` binds
/// `binding` to `process.binding` and `d` to `process.dlopen`.
fn bindings<'t>(
    left: Node<'t>,
    right: Node<'t>,
    source: &str,
    out: &mut Vec<(String, Node<'t>, Option<String>)>,
) {
    let name = |n: Node| syntax::identifier(syntax::text(n, source), G);
    match left.kind() {
        "identifier" => out.push((name(left), right, None)),
        "object_pattern" => {
            let mut cursor = left.walk();
            for property in left.named_children(&mut cursor) {
                match property.kind() {
                    "shorthand_property_identifier_pattern" => {
                        out.push((name(property), right, Some(name(property))));
                    }
                    "pair_pattern" => {
                        let key =
                            property
                                .child_by_field_name("key")
                                .and_then(|k| match k.kind() {
                                    "property_identifier" => Some(name(k)),
                                    _ => syntax::constant_string(k, source, G),
                                });
                        let value = property.child_by_field_name("value");
                        if let (Some(key), Some(value)) = (key, value) {
                            if value.kind() == "identifier" {
                                out.push((name(value), right, Some(key)));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

fn resolve(name: String, aliases: &HashMap<String, String>) -> String {
    let mut current = name;
    for _ in 0..8 {
        match aliases.get(&current) {
            Some(next) if *next != current => current = next.clone(),
            _ => break,
        }
    }
    current
}

/// The dotted name of an expression (`a.b['c']` → `a.b.c`); computed parts become `?`.
fn qualified(node: Node, source: &str, aliases: &HashMap<String, String>) -> String {
    let f = fields();
    let mut parts: Vec<String> = Vec::new();
    let mut current = node;
    for _ in 0..MAX_CHAIN {
        match current.kind() {
            "identifier" | "this" => {
                let name = syntax::identifier(syntax::text(current, source), G);
                parts.push(resolve(name, aliases));
                return join(parts);
            }
            "member_expression" => {
                let property = current.child_by_field_id(f.property);
                let object = current.child_by_field_id(f.object);
                let (Some(property), Some(object)) = (property, object) else {
                    break;
                };
                parts.push(syntax::identifier(syntax::text(property, source), G));
                current = object;
            }
            "subscript_expression" => {
                let key = current
                    .child_by_field_id(f.index)
                    .and_then(|k| syntax::constant_string(k, source, G));
                let Some(object) = current.child_by_field_id(f.object) else {
                    break;
                };
                parts.push(key.unwrap_or_else(|| "?".into()));
                current = object;
            }
            "parenthesized_expression" => match current.named_child(0) {
                Some(inner) => current = inner,
                None => break,
            },
            // `(0, eval)` is `eval`: a sequence is worth its last expression.
            "sequence_expression" => {
                match current.named_child(current.named_child_count().saturating_sub(1) as u32) {
                    Some(last) => current = last,
                    None => break,
                }
            }
            _ => break,
        }
    }
    parts.push("?".into());
    join(parts)
}

fn join(mut parts: Vec<String>) -> String {
    parts.reverse();
    parts.join(".")
}
