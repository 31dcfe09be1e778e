//! JavaScript facts from a tree-sitter tree: modules loaded (`require('fs')`, `import ... from
//! 'fs'`, `export ... from`, dynamic `import('fs')`), calls, `new` expressions and member
//! references, with names resolved through simple aliases (`const e = eval`) and global
//! objects (`globalThis['ev' + 'al']` is `eval`; `\u0065val` is `eval`).

use std::collections::HashMap;

use tree_sitter::{Node, Tree};

use crate::code::{name_forms, Facts, Named};
use crate::syntax::{self, Grammar};

const G: Grammar = Grammar::Javascript;
const PREFIXES: &[&str] = &["globalThis.", "window.", "global.", "self.", "this."];
const MAX_CHAIN: usize = 32;

syntax::fields!(G; property, object, index);

pub fn facts<'t>(tree: &'t Tree, source: &str) -> Facts<'t> {
    let mut facts = Facts::default();
    let mut aliases: HashMap<String, String> = HashMap::new();
    let mut calls = Vec::new();
    let mut news = Vec::new();
    let mut refs = Vec::new();
    let mut declarations = Vec::new();
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
            "call_expression" => calls.push(node),
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
                        "identifier" | "member_expression" | "subscript_expression"
                    );
                    if l.kind() == "identifier" && aliasing {
                        declarations.push((l, r));
                    }
                }
            }
            _ => {}
        }
        true
    });
    for (left, right) in declarations {
        let name = syntax::identifier(syntax::text(left, source), G);
        let target = qualified(right, source, &aliases);
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
        if names.iter().any(|n| n == "require" || n == "import") {
            if let Some(module) = first {
                facts.imports.push((module, call));
            }
        }
        facts.calls.push(Named {
            node: call,
            names,
            args,
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
        });
    }
    for node in refs {
        facts.refs.push(Named {
            node,
            names: name_forms(qualified(node, source, &aliases), PREFIXES),
            args: None,
        });
    }
    facts
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
