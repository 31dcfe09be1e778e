//! What a file sent with a request is, for its assessment: code of a language the assessor
//! reads (by its extension, else its `#!` line), other text, data, or something the code could
//! run that the assessor cannot read (a native program, compiled bytecode, a zip archive, a
//! script for another interpreter). The code may run any of them, so none is taken on trust.

use std::path::Path;

use crate::syntax::Grammar;

/// How a file is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileKind<'a> {
    /// Parsed and judged like code of this grammar.
    Code(Grammar, &'a str),
    /// Text of no known language: searched with the code rules' text patterns.
    Text(&'a str),
    /// Bytes that are not text and not a program: nothing to judge.
    Data,
    /// Something the code could run that the assessor cannot read; the reason says what.
    Opaque(String),
}

/// Leading bytes of formats that run as native code or that Python imports and runs from.
const MAGIC: &[(&[u8], &str)] = &[
    (b"\x7fELF", "a native program (ELF)"),
    (b"\xfe\xed\xfa\xce", "a native program (Mach-O)"),
    (b"\xfe\xed\xfa\xcf", "a native program (Mach-O)"),
    (b"\xce\xfa\xed\xfe", "a native program (Mach-O)"),
    (b"\xcf\xfa\xed\xfe", "a native program (Mach-O)"),
    (b"\x00asm", "a WebAssembly module"),
    (
        b"PK\x03\x04",
        "a zip archive (Python runs and imports code from one)",
    ),
];

/// Extensions of files that are loaded as native code or bytecode.
const NATIVE_EXTENSIONS: &[&str] = &[
    "so", "node", "dylib", "dll", "exe", "pyd", "pyc", "pyo", "pyz", "whl", "egg", "jar",
];

/// Interpreters whose scripts the assessor reads, by the name in a `#!` line.
fn interpreter(name: &str) -> Option<Grammar> {
    let bare = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    match bare {
        "python" | "pypy" => Some(Grammar::Python),
        "node" | "nodejs" | "bun" | "deno" => Some(Grammar::Javascript),
        "sh" | "bash" | "dash" | "zsh" | "ksh" | "mksh" | "ash" | "busybox" => Some(Grammar::Bash),
        _ => None,
    }
}

fn by_extension(path: &str) -> Option<Grammar> {
    let ext = Path::new(path).extension()?.to_str()?.to_ascii_lowercase();
    match ext.as_str() {
        "py" | "pyw" | "pyi" => Some(Grammar::Python),
        "js" | "mjs" | "cjs" => Some(Grammar::Javascript),
        "sh" | "bash" | "dash" | "zsh" | "ksh" => Some(Grammar::Bash),
        _ => None,
    }
}

/// The interpreter a `#!` line names (`#!/usr/bin/env -S python3 -u` names `python3`).
fn shebang(text: &str) -> Option<&str> {
    let line = text.strip_prefix("#!")?.lines().next().unwrap_or("");
    let mut words = line.split_whitespace();
    let first = words.next()?;
    let program = first.rsplit('/').next().unwrap_or(first);
    if program != "env" {
        return Some(program);
    }
    words.find(|w| !w.starts_with('-') && !w.contains('='))
}

/// Classifies a file by its path and bytes; `max_code` is the largest code the assessor parses.
pub fn kind<'a>(path: &str, bytes: &'a [u8], max_code: usize) -> FileKind<'a> {
    if let Some((_, what)) = MAGIC.iter().find(|(magic, _)| bytes.starts_with(magic)) {
        return FileKind::Opaque((*what).to_string());
    }
    // Python 3 bytecode: a version's magic number, whose last three bytes are `\r\r\n`.
    if bytes.len() >= 16 && &bytes[1..4] == b"\r\r\n" {
        return FileKind::Opaque("compiled Python bytecode".into());
    }
    let ext = Path::new(path)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if let Some(ext) = ext.filter(|e| NATIVE_EXTENSIONS.contains(&e.as_str())) {
        return FileKind::Opaque(format!("a .{ext} file, loaded as native code or bytecode"));
    }
    let text = std::str::from_utf8(bytes);
    let grammar = by_extension(path).or_else(|| {
        let program = shebang(text.as_ref().ok()?)?;
        interpreter(program)
    });
    match (text, grammar) {
        (Err(_), Some(_)) => FileKind::Opaque("code that is not UTF-8".into()),
        (Err(_), None) => FileKind::Data,
        (Ok(text), Some(_)) if text.len() > max_code => FileKind::Opaque(format!(
            "code of {} bytes, more than the {max_code} the assessor parses",
            text.len()
        )),
        (Ok(text), Some(grammar)) => FileKind::Code(grammar, text),
        (Ok(text), None) => match shebang(text) {
            Some(other) => FileKind::Opaque(format!(
                "a script for {other}, which the assessor does not read"
            )),
            None => FileKind::Text(text),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_told_apart_by_extension_shebang_and_magic() {
        let max = 1024;
        let cases: &[(&str, &[u8], &str)] = &[
            ("code/x.py", b"print(1)", "Code(Python"),
            ("lib/m.mjs", b"export {}", "Code(Javascript"),
            (
                "run",
                b"#!/usr/bin/env -S python3 -u\nprint(1)",
                "Code(Python",
            ),
            ("run", b"#!/bin/bash\nls", "Code(Bash"),
            ("tool", b"#!/usr/bin/perl\nprint 1", "Opaque"),
            ("data.csv", b"a,b\n1,2\n", "Text"),
            ("a.out", b"\x7fELF\x02\x01\x01", "Opaque"),
            ("m.cpython-312-x86_64-linux-gnu.so", b"xx", "Opaque"),
            ("img.png", b"\x89PNG\r\n\x1a\n\x00\x00\xff", "Data"),
            ("x.py", b"\xff\xfe", "Opaque"),
            ("big.py", &[b'#'; 2048], "Opaque"),
            ("app.zip", b"PK\x03\x04rest", "Opaque"),
            ("m.pyc", b"\xcb\r\r\n\0\0\0\0\0\0\0\0\0\0\0\0", "Opaque"),
        ];
        for (path, bytes, want) in cases {
            let got = format!("{:?}", kind(path, bytes, max));
            assert!(got.starts_with(want), "{path}: {got}");
        }
    }
}
