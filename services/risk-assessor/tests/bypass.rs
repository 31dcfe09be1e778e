//! The bypass corpus, as a record of what the assessor says today.
//!
//! The assessment is ADVISORY: a miss here is not a hole, because isolation
//! is the boundary — every tier runs the code in a hardened container. These tests pin the
//! current verdicts so a change in what the assessor catches is a visible, reviewed diff,
//! in either direction. Rows marked MISS are known misses.

use messages::exec::Tier;
use messages::risk::{AssessRequest, ContentType, RiskLevel};
use risk_assessor::assess;

use ContentType::{Javascript as J, Python as P, Shell as S};
use RiskLevel::{Critical, High, Medium, Safe};

/// (content type, source, level today, tier under strict mode, a rule that fires)
const CORPUS: &[(ContentType, &str, RiskLevel, Tier, Option<&str>)] = &[
    // --- Python ---
    (
        P,
        "getattr(__builtins__,'ev'+'al')('1')",
        Critical,
        Tier::Session,
        Some("py.eval"),
    ),
    (
        P,
        "__import__('o'+'s').system('id')",
        Critical,
        Tier::Session,
        Some("py.import_os"),
    ),
    (
        P,
        "importlib.import_module(bytes.fromhex('6f73').decode())",
        Critical,
        Tier::Session,
        Some("py.dynamic_import"),
    ),
    (
        P,
        "import base64\nexec(base64.b64decode('cHJpbnQoMSk='))",
        Critical,
        Tier::Session,
        Some("py.exec"),
    ),
    // MISS: rot13 is only a string transform; nothing names a dangerous operation.
    (
        P,
        "import codecs\ncodecs.decode('bf.flfgrz','rot13')",
        Safe,
        Tier::Ephemeral,
        None,
    ),
    (
        P,
        "\"\".__class__.__bases__[0].__subclasses__()",
        Critical,
        Tier::Session,
        Some("py.introspection"),
    ),
    (
        P,
        "w = x.__init__.__globals__['system']",
        Critical,
        Tier::Session,
        Some("py.introspection"),
    ),
    (
        P,
        "import sys\nsys.modules['os'].system('id')",
        Critical,
        Tier::Session,
        Some("py.os_system"),
    ),
    (
        P,
        "f = types.FunctionType(compile('1','f','eval'), {})",
        Critical,
        Tier::Session,
        Some("py.compile"),
    ),
    (
        P,
        "import pickle\npickle.loads(b'x')",
        High,
        Tier::Session,
        Some("py.import_pickle"),
    ),
    (
        P,
        "import ctypes\nctypes.CDLL(None)",
        High,
        Tier::Session,
        Some("py.import_ctypes"),
    ),
    // MISS: breakpoint() opens pdb, which can run anything; not in the seeds' lists.
    (P, "breakpoint()", Safe, Tier::Ephemeral, None),
    // Python folds identifiers with NFKC, and so does the assessor.
    (
        P,
        "ｅｘｅｃ('print(1)')",
        Critical,
        Tier::Session,
        Some("py.exec"),
    ),
    // --- JavaScript ---
    (
        J,
        "require('child'+'_process').execSync('id')",
        Critical,
        Tier::Session,
        Some("js.child_process"),
    ),
    (
        J,
        "globalThis['ev'+'al']('1')",
        Critical,
        Tier::Session,
        Some("js.eval"),
    ),
    (
        J,
        "Function('return process')()",
        Critical,
        Tier::Session,
        Some("js.new_function"),
    ),
    (
        J,
        "import('child_process').then(m => m.execSync('id'))",
        Critical,
        Tier::Session,
        Some("js.child_process"),
    ),
    (
        J,
        "\\u0065val('1')",
        Critical,
        Tier::Session,
        Some("js.eval"),
    ),
    // MISS: process.binding reaches native internals; not in the seeds' lists.
    (
        J,
        "process.binding('spawn_sync')",
        Safe,
        Tier::Ephemeral,
        None,
    ),
    // --- Shell (PayloadsAllTheThings, Command Injection) ---
    (S, "r''m -rf /", Critical, Tier::Reject, Some("sh.rm_root")),
    (S, "r\\m -rf /", Critical, Tier::Reject, Some("sh.rm_root")),
    (
        S,
        "w\"h\"o\"am\"i",
        Medium,
        Tier::Session,
        Some("sh.not_allowlisted"),
    ),
    (
        S,
        "who$@ami",
        High,
        Tier::Session,
        Some("sh.dynamic_command"),
    ),
    (
        S,
        "$'\\x72\\x6d' -rf /",
        Critical,
        Tier::Reject,
        Some("sh.rm_root"),
    ),
    (
        S,
        "a=r;b=m;$a$b -rf /",
        High,
        Tier::Session,
        Some("sh.dynamic_command"),
    ),
    (
        S,
        "cat${IFS}/etc/passwd",
        High,
        Tier::Session,
        Some("sh.dynamic_command"),
    ),
    (
        S,
        "${PATH:0:1}bin/rm -rf /",
        High,
        Tier::Session,
        Some("sh.dynamic_command"),
    ),
    // The bash grammar does not accept a brace list as a command: judged on its text.
    (S, "{rm,-rf,/x}", Medium, Tier::Session, Some("sh.unparsed")),
    (
        S,
        "$(printf rm) -rf /",
        High,
        Tier::Session,
        Some("sh.dynamic_command"),
    ),
    (
        S,
        "`echo rm` -rf /",
        High,
        Tier::Session,
        Some("sh.dynamic_command"),
    ),
    (
        S,
        "/???/?m -rf /",
        High,
        Tier::Session,
        Some("sh.dynamic_command"),
    ),
    (
        S,
        "$(rev<<<'mr') -rf /",
        High,
        Tier::Session,
        Some("sh.substitution"),
    ),
    (
        S,
        "echo cm0gLXJm|base64 -d|sh",
        High,
        Tier::Session,
        Some("sh.pipe_to_shell"),
    ),
    (
        S,
        "eval 'rm -rf /'",
        Critical,
        Tier::Reject,
        Some("sh.rm_root"),
    ),
    // MISS (partly): an alias is not followed; `x` is only "not on the safe list".
    (
        S,
        "alias x=rm; x -rf /",
        Medium,
        Tier::Session,
        Some("sh.not_allowlisted"),
    ),
    (
        S,
        "echo / | xargs rm -rf",
        High,
        Tier::Session,
        Some("sh.rm"),
    ),
    (
        S,
        "bash -c 'rm -rf /'",
        Critical,
        Tier::Reject,
        Some("sh.rm_root"),
    ),
];

#[test]
fn the_bypass_corpus_verdicts_are_recorded() {
    let mut changed = Vec::new();
    for &(content_type, source, level, tier, rule) in CORPUS {
        let a = assess(&AssessRequest {
            content: source.into(),
            content_type,
            params: None,
            mode: None,
        })
        .unwrap();
        let fired = rule.is_none_or(|r| a.findings.iter().any(|f| f.rule == r));
        if a.level != level || a.suggested_tier != tier || !fired {
            changed.push(format!(
                "{source:?}: now {:?}/{:?} {:?}, recorded {level:?}/{tier:?} {rule:?}",
                a.level,
                a.suggested_tier,
                a.findings.iter().map(|f| &f.rule).collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        changed.is_empty(),
        "verdicts changed:\n{}",
        changed.join("\n")
    );
}
