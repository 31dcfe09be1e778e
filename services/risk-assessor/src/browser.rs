//! Browser actions: the action name and its parameters, lowered,
//! matched against the browser rules' `actions` globs and `pattern` regexes.

use crate::glob;
use crate::hits::Hit;
use crate::policy::{Language, Policy};

pub fn hits(action: &str, params: Option<&serde_json::Value>, policy: &Policy) -> Vec<Hit> {
    let action = action.trim().to_lowercase();
    // Parameters as compact JSON: keys count too (`{"password": ...}` is a password field).
    let params = params.map(|p| p.to_string()).unwrap_or_default();
    let text = format!("{action} {params}").to_lowercase();
    let mut out = Vec::new();
    for (rule, r) in policy.rules_for(Language::Browser) {
        let by_action = glob::any(&r.actions, &action);
        let by_pattern = r.pattern.as_ref().and_then(|re| re.find(&text));
        if by_action || by_pattern.is_some() {
            let detail = by_pattern.map(|m| format!("mentions {:?}", m.as_str()));
            out.push(Hit {
                rule,
                line: 0,
                start: 0,
                end: 0,
                detail: detail.or_else(|| Some(format!("action {action}"))),
            });
        }
    }
    out
}
