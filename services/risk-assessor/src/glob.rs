//! Name globs for rules: `*` matches any run of characters (dots included), everything else
//! matches itself. Matching is linear-time (greedy with one backtrack point), so a hostile
//! name cannot make it slow.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(String);

impl Glob {
    pub fn new(pattern: &str) -> Self {
        Self(pattern.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, name: &str) -> bool {
        let (p, n) = (self.0.as_bytes(), name.as_bytes());
        let (mut pi, mut ni) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while ni < n.len() {
            if pi < p.len() && p[pi] == b'*' {
                star = Some((pi, ni));
                pi += 1;
            } else if pi < p.len() && p[pi] == n[ni] {
                pi += 1;
                ni += 1;
            } else if let Some((sp, sn)) = star {
                pi = sp + 1;
                ni = sn + 1;
                star = Some((sp, sn + 1));
            } else {
                return false;
            }
        }
        p[pi..].iter().all(|&c| c == b'*')
    }
}

/// Whether any glob of the list matches.
pub fn any(globs: &[Glob], name: &str) -> bool {
    globs.iter().any(|g| g.matches(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_match_any_run_and_the_rest_is_literal() {
        let cases = [
            ("os.system", "os.system", true),
            ("os.system", "os.systemx", false),
            ("subprocess.*", "subprocess.run", true),
            ("subprocess.*", "subprocess", false),
            ("*.write", "sys.stdout.write", true),
            ("*.write", "write", false),
            ("mkfs.*", "mkfs.ext4", true),
            ("*", "", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
        ];
        for (p, n, want) in cases {
            assert_eq!(Glob::new(p).matches(n), want, "{p} vs {n}");
        }
    }
}
