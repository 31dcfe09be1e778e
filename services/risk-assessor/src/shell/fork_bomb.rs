//! Fork-bomb detection during the one tree walk: functions being walked and how often each
//! calls itself. Lookups are by name, so deeply nested definitions stay linear.

use std::collections::HashMap;

use tree_sitter::Node;

use super::words::word;

/// Functions being walked and how often each calls itself: two calls (`:|:`) is a fork bomb.
#[derive(Default)]
pub struct ForkBombs<'t> {
    /// Enclosing functions: (end byte, name, index in `found`).
    open: Vec<(usize, String, usize)>,
    /// Name → indices of enclosing functions with that name (innermost last).
    by_name: HashMap<String, Vec<usize>>,
    found: Vec<(Node<'t>, String, u32)>,
}

impl<'t> ForkBombs<'t> {
    pub fn enter(&mut self, node: Node<'t>, source: &str) {
        let Some(name) = node.child_by_field_name("name") else {
            return;
        };
        let name = word(name, source).value.unwrap_or_default();
        let index = self.found.len();
        self.found.push((node, name.clone(), 0));
        self.open.push((node.end_byte(), name.clone(), index));
        self.by_name.entry(name).or_default().push(index);
    }

    pub fn leave_before(&mut self, start: usize) {
        while let Some((end, _, _)) = self.open.last() {
            if *end > start {
                break;
            }
            let (_, name, _) = self.open.pop().expect("checked");
            if let Some(stack) = self.by_name.get_mut(&name) {
                stack.pop();
            }
        }
    }

    pub fn called(&mut self, name: &str) {
        if let Some(&index) = self.by_name.get(name).and_then(|s| s.last()) {
            self.found[index].2 += 1;
        }
    }

    pub fn bombs(self) -> impl Iterator<Item = (Node<'t>, String)> {
        self.found
            .into_iter()
            .filter(|(_, _, calls)| *calls >= 2)
            .map(|(node, name, _)| (node, name))
    }
}
