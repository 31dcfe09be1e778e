//! Key names to `Input.dispatchKeyEvent` fields (a US layout, as CDP clients assume).

use serde_json::{json, Value};

/// CDP's key fields for a key name (`Enter`, `a`, `ArrowDown`, ...; names ignore case), or
/// `None` for a name it does not know.
pub fn key_event(key: &str) -> Option<Value> {
    let named = [
        ("Enter", 13, "\r"),
        ("Tab", 9, ""),
        ("Backspace", 8, ""),
        ("Escape", 27, ""),
        ("Delete", 46, ""),
        ("ArrowLeft", 37, ""),
        ("ArrowUp", 38, ""),
        ("ArrowRight", 39, ""),
        ("ArrowDown", 40, ""),
        ("Home", 36, ""),
        ("End", 35, ""),
        ("PageUp", 33, ""),
        ("PageDown", 34, ""),
        ("Space", 32, " "),
        ("Control", 17, ""),
        ("Shift", 16, ""),
        ("Alt", 18, ""),
        ("Meta", 91, ""),
        ("Insert", 45, ""),
    ];
    if let Some((name, code, text)) = named.iter().find(|(n, _, _)| n.eq_ignore_ascii_case(key)) {
        let key = if *name == "Space" { " " } else { name };
        return Some(
            json!({"key": key, "code": name, "windowsVirtualKeyCode": code, "text": text}),
        );
    }
    let function = key
        .strip_prefix(['F', 'f'])
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|n| (1..=12).contains(n));
    if let Some(n) = function {
        let name = format!("F{n}");
        return Some(
            json!({"key": name, "code": name, "windowsVirtualKeyCode": 111 + n, "text": ""}),
        );
    }
    let mut chars = key.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => {
            let upper = c.to_ascii_uppercase();
            let code = if upper.is_ascii_alphanumeric() {
                upper as u32
            } else {
                0
            };
            Some(
                json!({"key": c.to_string(), "windowsVirtualKeyCode": code, "text": c.to_string()}),
            )
        }
        _ => None,
    }
}

/// The `modifiers` bit of a modifier key's name, `None` for any other key.
pub fn modifier_bit(key: &str) -> Option<u32> {
    match key.to_ascii_lowercase().as_str() {
        "alt" => Some(1),
        "control" | "ctrl" => Some(2),
        "meta" | "command" | "cmd" => Some(4),
        "shift" => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_cdp_fields() {
        assert_eq!(key_event("enter").unwrap()["windowsVirtualKeyCode"], 13);
        assert_eq!(key_event("a").unwrap()["text"], "a");
        assert!(key_event("NotAKey").is_none());
        assert_eq!(key_event("f5").unwrap()["windowsVirtualKeyCode"], 116);
        assert!(key_event("F13").is_none());
        assert_eq!(modifier_bit("Ctrl"), Some(2));
    }
}
