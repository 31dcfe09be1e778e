//! The `Assessor`: a pure function of (policy, limits, request) → `RiskAssessment`. It parses
//! the code and each file sent with it, applies the policy's rules, and turns the findings into
//! a level, a reason, the confirmation and isolation flags, and the tier the request's
//! `SecurityMode` requires.

use std::time::{Duration, Instant};

use messages::exec::{FileSpec, Tier};
use messages::risk::{
    AssessRequest, ContentType, Finding, RiskAssessment, RiskLevel, SecurityMode,
};
use messages::ErrorBody;

use crate::files::{self, FileKind};
use crate::hits::{Hit, Hits};
use crate::policy::{Detector, Language, Policy};
use crate::shell::{self, Origin};
use crate::syntax::{self, Grammar, Unparsed};
use crate::{browser, code, javascript, python};

/// Bounds on the work one assessment may do.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest `content` accepted, in bytes (larger → 413).
    pub max_content_bytes: usize,
    /// Time one parse may take before the code is judged on its text alone. The files of a
    /// request share one more such budget.
    pub parse_budget: Duration,
    /// Findings returned (the most severe first); the level counts all of them.
    pub max_findings: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_content_bytes: 256 * 1024,
            parse_budget: Duration::from_secs(2),
            max_findings: 64,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssessError {
    #[error("content is {size} bytes; the risk-assessor accepts at most {max}")]
    TooLarge { size: usize, max: usize },
}

impl From<AssessError> for ErrorBody {
    fn from(e: AssessError) -> Self {
        match e {
            AssessError::TooLarge { .. } => ErrorBody::too_large(e.to_string()),
        }
    }
}

/// What analysing one content produced, before it becomes a `RiskAssessment`.
#[derive(Default)]
struct Outcome {
    hits: Vec<Hit>,
    unparsed: Option<Unparsed>,
    /// Browser findings have no source spans.
    spans: bool,
    /// The code imports a browser automation library.
    needs_browser: bool,
}

pub struct Assessor {
    policy: Policy,
    limits: Limits,
    mode: SecurityMode,
}

// === impl Assessor ===

impl Assessor {
    pub fn new(policy: Policy, limits: Limits, mode: SecurityMode) -> Self {
        Self {
            policy,
            limits,
            mode,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Assesses one request; `suggested_tier` is already resolved under the request's mode
    /// (or this assessor's default mode).
    pub fn assess(&self, request: &AssessRequest) -> Result<RiskAssessment, AssessError> {
        let content = request.content.as_str();
        if content.len() > self.limits.max_content_bytes {
            return Err(AssessError::TooLarge {
                size: content.len(),
                max: self.limits.max_content_bytes,
            });
        }
        let budget = self.limits.parse_budget;
        let outcome = match request.content_type {
            ContentType::Python => self.code(content, Grammar::Python, Language::Python, budget),
            ContentType::Javascript => {
                self.code(content, Grammar::Javascript, Language::Javascript, budget)
            }
            ContentType::Shell => self.shell(content, budget),
            ContentType::Browser => Outcome {
                hits: browser::hits(content, request.params.as_ref(), &self.policy),
                unparsed: None,
                spans: false,
                needs_browser: false,
            },
        };
        // The files share one parse budget, so many of them cannot multiply the work.
        let deadline = Instant::now() + self.limits.parse_budget;
        let files = request
            .files
            .iter()
            .map(|file| (file.path.as_str(), self.file(file, deadline)))
            .collect();
        let under_policy = request.under_network_policy();
        let mut assessment = self.verdict(request.content_type, outcome, files, under_policy);
        assessment.suggested_tier = assessment.required_tier(request.mode.unwrap_or(self.mode));
        Ok(assessment)
    }

    /// A file sent with the request, judged as what it is ([`files::kind`]).
    fn file(&self, file: &FileSpec, deadline: Instant) -> Outcome {
        let bytes = match file.bytes() {
            Ok(bytes) => bytes,
            Err(e) => return self.opaque(format!("its content does not decode: {e}")),
        };
        let budget = deadline.saturating_duration_since(Instant::now());
        match files::kind(&file.path, &bytes, self.limits.max_content_bytes) {
            FileKind::Code(Grammar::Bash, text) => self.shell(text, budget),
            FileKind::Code(Grammar::Python, text) => {
                self.code(text, Grammar::Python, Language::Python, budget)
            }
            FileKind::Code(Grammar::Javascript, text) => {
                self.code(text, Grammar::Javascript, Language::Javascript, budget)
            }
            FileKind::Text(text) => {
                // Any interpreter may be told to run it, so it is searched with what would
                // make code of every language ask a person.
                let mut hits = Hits::default();
                for language in [Language::Python, Language::Javascript, Language::Shell] {
                    let asking = self
                        .policy
                        .rules_for(language)
                        .filter(|(_, rule)| rule.severity >= RiskLevel::High);
                    for (index, rule) in asking {
                        if let Some(re) = &rule.text {
                            hits.add_regex(index, re, text, 0);
                        }
                    }
                }
                Outcome {
                    hits: hits.into_vec(),
                    spans: true,
                    ..Outcome::default()
                }
            }
            FileKind::Data => Outcome::default(),
            FileKind::Opaque(what) => self.opaque(what),
        }
    }

    /// The finding for a file the assessor cannot read, spanning the whole file.
    fn opaque(&self, what: String) -> Outcome {
        let mut hits = Hits::default();
        for (index, rule) in self.policy.rules_for(Language::File) {
            if rule.detector == Some(Detector::Opaque) {
                hits.add_span(index, 1, 0, 0, Some(what.clone()));
            }
        }
        Outcome {
            hits: hits.into_vec(),
            ..Outcome::default()
        }
    }

    fn code(
        &self,
        content: &str,
        grammar: Grammar,
        language: Language,
        budget: Duration,
    ) -> Outcome {
        let mut hits = Hits::default();
        let mut needs_browser = false;
        let unparsed = match syntax::parse(grammar, content, budget) {
            Ok(tree) => {
                let facts = match grammar {
                    Grammar::Python => python::facts(&tree, content),
                    _ => javascript::facts(&tree, content),
                };
                code::apply(&facts, content, &self.policy, language, grammar, &mut hits);
                needs_browser = code::needs_browser(&facts);
                None
            }
            Err(unparsed) => {
                self.on_text(content, language, &unparsed, Origin::TOP, &mut hits);
                Some(unparsed)
            }
        };
        Outcome {
            hits: hits.into_vec(),
            unparsed,
            spans: true,
            needs_browser,
        }
    }

    fn shell(&self, content: &str, budget: Duration) -> Outcome {
        let mut hits = Hits::default();
        let unparsed = self.shell_script(content, Origin::TOP, budget, &mut hits);
        Outcome {
            hits: hits.into_vec(),
            unparsed,
            spans: true,
            needs_browser: false,
        }
    }

    /// One shell script, top-level or embedded (`sh -c`, `eval`) at `origin`.
    fn shell_script(
        &self,
        source: &str,
        origin: Origin,
        budget: Duration,
        hits: &mut Hits,
    ) -> Option<Unparsed> {
        match syntax::parse(Grammar::Bash, source, budget) {
            Ok(tree) => {
                let mut nested = |script: &str, origin: Origin, hits: &mut Hits| {
                    self.shell_script(script, origin, budget, hits);
                };
                shell::Analysis {
                    source,
                    policy: &self.policy,
                    hits,
                    origin,
                    nested: &mut nested,
                }
                .run(&tree);
                None
            }
            Err(unparsed) => {
                self.on_text(source, Language::Shell, &unparsed, origin, hits);
                Some(unparsed)
            }
        }
    }

    /// Code that does not parse: every rule's `text` and `pattern` regexes on the raw source,
    /// plus the `unparsed` finding, so it can never come out SAFE.
    fn on_text(
        &self,
        source: &str,
        language: Language,
        unparsed: &Unparsed,
        origin: Origin,
        hits: &mut Hits,
    ) {
        for (index, rule) in self.policy.rules_for(language) {
            for re in [&rule.text, &rule.pattern].into_iter().flatten() {
                hits.add_regex(index, re, source, origin.offset);
            }
            if rule.detector == Some(Detector::Unparsed) {
                let (line, start, end) = match unparsed {
                    Unparsed::Syntax { line, start, end } => {
                        (*line, *start as usize, *end as usize)
                    }
                    Unparsed::Budget(_) => (1, 0, source.len()),
                };
                let line = origin.line + line - 1;
                let (start, end) = (origin.offset + start, origin.offset + end);
                hits.add_span(index, line, start, end, Some(unparsed.explain()));
            }
        }
    }

    /// One verdict over the code and its files: the level is the most severe finding of any.
    fn verdict(
        &self,
        content_type: ContentType,
        outcome: Outcome,
        files: Vec<(&str, Outcome)>,
        under_policy: bool,
    ) -> RiskAssessment {
        let rules = &self.policy.rules;
        let severity = |rule: usize| {
            let rule = &rules[rule];
            if under_policy && rule.fetches {
                rule.severity.min(RiskLevel::Low)
            } else {
                rule.severity
            }
        };
        let needs_browser =
            outcome.needs_browser || files.iter().any(|(_, file)| file.needs_browser);
        let code_spans = outcome.spans;
        let unparsed = outcome.unparsed;
        // (file path, or None for the code; the hit)
        let mut hits: Vec<(Option<&str>, Hit)> =
            outcome.hits.into_iter().map(|h| (None, h)).collect();
        for (path, file) in files {
            hits.extend(file.hits.into_iter().map(|h| (Some(path), h)));
        }
        hits.sort_by(|(pa, a), (pb, b)| {
            let (sa, sb) = (severity(a.rule), severity(b.rule));
            sb.cmp(&sa).then(pa.cmp(pb)).then(a.start.cmp(&b.start))
        });
        let found = hits.iter().map(|(_, h)| severity(h.rule)).max();
        let browser = content_type == ContentType::Browser;
        // An ordinary browser action is LOW, code with nothing found is SAFE.
        let level = found.unwrap_or(if browser {
            RiskLevel::Low
        } else {
            RiskLevel::Safe
        });
        let suggested_tier = if browser {
            Tier::Aio
        } else if content_type == ContentType::Shell && level == RiskLevel::Critical {
            Tier::Reject
        } else if needs_browser {
            // Only the AIO tier has a browser to drive.
            Tier::Aio
        } else if level <= RiskLevel::Low {
            Tier::Ephemeral
        } else {
            Tier::Session
        };
        let reason = reason(content_type, level, &hits, unparsed.as_ref(), &self.policy);
        let reason = if under_policy && hits.iter().any(|(_, h)| rules[h.rule].fetches) {
            format!("{reason} (network access is bounded by the request's network policy)")
        } else {
            reason
        };
        let findings = hits
            .iter()
            .take(self.limits.max_findings)
            .map(|(path, h)| {
                let rule = &rules[h.rule];
                let description = match &h.detail {
                    Some(d) => format!("{} — {d}", rule.description),
                    None => rule.description.clone(),
                };
                // Browser findings and a file's opaque finding have no span in a source.
                let spans = match path {
                    None => code_spans,
                    Some(_) => rule.detector != Some(Detector::Opaque),
                };
                let span = |v: u32| spans.then_some(v);
                Finding {
                    rule: rule.id.clone(),
                    severity: severity(h.rule),
                    description,
                    path: path.map(str::to_string),
                    line: span(h.line),
                    start: span(h.start),
                    end: span(h.end),
                }
            })
            .collect();
        RiskAssessment {
            level,
            reason,
            requires_confirmation: level >= RiskLevel::High,
            requires_isolation: !browser && level >= RiskLevel::Medium,
            suggested_tier,
            findings,
        }
    }
}

fn reason(
    content_type: ContentType,
    level: RiskLevel,
    hits: &[(Option<&str>, Hit)],
    unparsed: Option<&Unparsed>,
    policy: &Policy,
) -> String {
    let summary = match hits.first() {
        None if content_type == ContentType::Browser => "ordinary browser action".to_string(),
        None if content_type == ContentType::Shell => {
            "every command is on the safe list, with no redirection or substitution".to_string()
        }
        None => "no risky operation found".to_string(),
        Some((path, top)) => {
            let rule = &policy.rules[top.rule];
            let at = match path {
                _ if content_type == ContentType::Browser => String::new(),
                None => format!(" (line {})", top.line),
                Some(path) if rule.detector == Some(Detector::Opaque) => {
                    format!(" (file {path})")
                }
                Some(path) => format!(" (file {path}, line {})", top.line),
            };
            let more = match hits.len() - 1 {
                0 => String::new(),
                1 => ", and 1 more finding".to_string(),
                n => format!(", and {n} more findings"),
            };
            let detail = top
                .detail
                .as_ref()
                .map(|d| format!(" — {d}"))
                .unwrap_or_default();
            format!(
                "{}: {}{detail} [{}]{at}{more}",
                level.as_str(),
                rule.description,
                rule.id
            )
        }
    };
    match unparsed {
        None => summary,
        Some(u) => format!(
            "did not parse as {} ({}), so it was judged on its text: {summary}",
            content_type.as_str(),
            u.explain()
        ),
    }
}
