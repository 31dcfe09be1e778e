//! The workspace's crates build one integration-test binary each (`autotests = false`,
//! `tests/main.rs` declaring every file of `tests/` as a module). Cargo then ignores a file
//! that `main.rs` does not name: this test fails instead of the file's tests silently never
//! running.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("test-support sits in crates/ of the workspace root")
        .to_path_buf()
}

/// Every crate directory under `dir` whose manifest turns test discovery off.
fn crates_without_autotests(dir: &Path, found: &mut Vec<PathBuf>) {
    let manifest = dir.join("Cargo.toml");
    if std::fs::read_to_string(&manifest).is_ok_and(|m| m.contains("autotests = false")) {
        found.push(dir.to_path_buf());
    }
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let skip = name.to_string_lossy().starts_with('.') || name == "target";
        if path.is_dir() && !skip {
            crates_without_autotests(&path, found);
        }
    }
}

/// The modules a `tests/` directory holds: `x.rs` and `x/mod.rs`, `main.rs` aside.
fn test_files(tests: &Path) -> BTreeSet<String> {
    std::fs::read_dir(tests)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let stem = path.file_stem()?.to_str()?.to_string();
            let module = path.extension().is_some_and(|x| x == "rs") && stem != "main"
                || path.join("mod.rs").is_file();
            module.then_some(stem)
        })
        .collect()
}

fn declared_modules(main_rs: &str) -> BTreeSet<String> {
    main_rs
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_test_file_is_a_module_of_its_crates_test_binary() {
    let mut crates = Vec::new();
    crates_without_autotests(&workspace_root(), &mut crates);
    assert!(
        crates.len() >= 10,
        "found only {} crates with one test binary under {}",
        crates.len(),
        workspace_root().display()
    );
    let mut left_out = Vec::new();
    for dir in &crates {
        let tests = dir.join("tests");
        let main_rs = std::fs::read_to_string(tests.join("main.rs")).unwrap_or_else(|e| {
            panic!(
                "{}: autotests = false but no tests/main.rs: {e}",
                dir.display()
            )
        });
        let declared = declared_modules(&main_rs);
        for file in test_files(&tests).difference(&declared) {
            left_out.push(format!("{}/tests/{file}", dir.display()));
        }
    }
    assert!(
        left_out.is_empty(),
        "not a module of its crate's tests/main.rs, so never compiled or run: {left_out:?}"
    );
}

#[test]
fn a_file_left_out_of_main_is_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.rs"), "mod a;\n").unwrap();
    std::fs::write(dir.path().join("a.rs"), "").unwrap();
    std::fs::write(dir.path().join("b.rs"), "").unwrap();
    std::fs::create_dir(dir.path().join("common")).unwrap();
    std::fs::write(dir.path().join("common/mod.rs"), "").unwrap();
    let declared = declared_modules("mod a;\n");
    let missing: Vec<_> = test_files(dir.path())
        .difference(&declared)
        .cloned()
        .collect();
    assert_eq!(missing, ["b", "common"]);
}

/// The folders under `services/` that are programs (a `main.rs`): they serve subjects, and meet
/// other services only on those subjects.
fn service_crates(root: &Path) -> BTreeSet<String> {
    std::fs::read_dir(root.join("services"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("src/main.rs").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The package names a manifest's `[dependencies]` section names (dev-dependencies aside:
/// a test may start any service).
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut in_section = false;
    let mut names = BTreeSet::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == "[dependencies]";
        } else if in_section {
            if let Some((name, _)) = line.split_once('=') {
                names.insert(name.trim().to_string());
            }
        }
    }
    names
}

#[test]
fn no_service_depends_on_another_service() {
    let root = workspace_root();
    let services = service_crates(&root);
    assert!(services.len() >= 10, "found only {services:?}");
    let mut crossings = Vec::new();
    for service in &services {
        let manifest =
            std::fs::read_to_string(root.join("services").join(service).join("Cargo.toml"))
                .unwrap();
        for dep in dependencies(&manifest) {
            let other = dep.strip_prefix("sandmesh-").unwrap_or(&dep);
            if other != service && services.contains(other) {
                crossings.push(format!("{service} → {other}"));
            }
        }
    }
    assert!(
        crossings.is_empty(),
        "services meet only on subjects, never through each other's code: {crossings:?}"
    );
}

#[test]
fn a_dependency_on_another_service_is_found() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nsandmesh-kit.workspace = true\n\
                    sandmesh-scheduler = { path = \"../scheduler\" }\n[dev-dependencies]\n\
                    sandmesh-gateway.workspace = true\n";
    let deps = dependencies(manifest);
    assert!(deps.contains("sandmesh-scheduler"), "{deps:?}");
    assert!(!deps.contains("sandmesh-gateway"), "{deps:?}");
}

/// Every Rust file of the workspace's own code (build output and tools aside).
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "tmp" {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, found);
        } else if name.ends_with(".rs") {
            found.push(path);
        }
    }
}

#[test]
fn every_container_starts_from_the_hardened_host_config() {
    let root = workspace_root();
    let hardening = root.join("crates/containers/src/lib.rs");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    // A struct literal of bollard's host config, or its `default()`, would start a container
    // from Docker's defaults, not from the one hardened definition. (The needles are spelled
    // in pieces, so this file does not match itself.)
    let literal = ["HostConfig", " {"].concat();
    let default = ["HostConfig", "::default("].concat();
    let mut own_configs = Vec::new();
    for file in files.iter().filter(|f| **f != hardening) {
        let text = std::fs::read_to_string(file).unwrap();
        if text.contains(&literal) || text.contains(&default) {
            own_configs.push(file.strip_prefix(&root).unwrap().display().to_string());
        }
    }
    assert!(
        std::fs::read_to_string(&hardening)
            .unwrap()
            .contains("pub fn hardened_host_config"),
        "the hardened definition moved: update this test"
    );
    assert!(
        own_configs.is_empty(),
        "build the HostConfig with containers::hardened_host_config and change only what the \
         workload needs: {own_configs:?}"
    );
}

/// Every Markdown file of the repository (build output, tools and venvs aside).
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || ["target", "tmp", "node_modules", "venv"].contains(&&*name) {
            continue;
        }
        if path.is_dir() {
            markdown_files(&path, found);
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// The relative targets of a Markdown text's links (`[text](target)`), anchors cut off.
fn relative_links(markdown: &str) -> Vec<String> {
    markdown
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|target| target.split('#').next().unwrap_or("").trim().to_string())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

#[test]
fn documents_link_only_to_files_of_the_repository() {
    let root = workspace_root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(
        files.len() >= 10,
        "found only {} Markdown files",
        files.len()
    );
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for link in relative_links(&text) {
            if !file.parent().unwrap().join(&link).exists() {
                let doc = file.strip_prefix(&root).unwrap().display().to_string();
                broken.push(format!("{doc} → {link}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to files the repository lacks: {broken:?}"
    );
}

#[test]
fn a_link_to_a_missing_file_is_found() {
    let text = "see [a](docs/a.md#x), [web](https://example.org/), [b](../b.md) and [](#here)";
    assert_eq!(relative_links(text), ["docs/a.md", "../b.md"]);
}

/// Whether a line cites something a reader of the repository cannot open: the design file (its
/// name in capitals, then `.md` or ` §`), a seed document (the word, then `00N` after a space,
/// `_` or `-`) or a tracker's issue (the word, then a number, `#` allowed). (The needles are
/// spelled in pieces, so this file does not match itself.)
fn cites_the_unreachable(line: &str) -> bool {
    let design = ["DES", "IGN"].concat();
    if line.contains(&format!("{design}.md")) || line.contains(&format!("{design} §")) {
        return true;
    }
    let lower = line.to_lowercase();
    let followed_by = |word: &str, next: &dyn Fn(&str) -> bool| {
        lower.match_indices(word).any(|(at, _)| {
            let starts_word = !lower[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric());
            let rest = lower[at + word.len()..].trim_start_matches('s');
            starts_word && next(rest)
        })
    };
    let seed = |rest: &str| {
        rest.strip_prefix([' ', '_', '-'])
            .is_some_and(|r| r.starts_with("00"))
    };
    let issue = |rest: &str| {
        rest.strip_prefix(' ')
            .map(|r| r.trim_start_matches('#'))
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
    };
    followed_by(&["se", "ed"].concat(), &seed) || followed_by(&["iss", "ue"].concat(), &issue)
}

/// The repository's tracked sources and documents: what a reader of the code reads. Saved
/// loadtest runs are records of their day and keep their words; `Cargo.lock` is generated.
fn tracked_sources_and_documents(root: &Path) -> Vec<String> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .expect("git lists the tracked files: install git and run the tests from a checkout");
    assert!(out.status.success(), "git ls-files failed: {out:?}");
    String::from_utf8(out.stdout)
        .expect("tracked paths are UTF-8")
        .split('\0')
        .filter(|p| {
            let source = [".rs", ".md", ".toml", ".sh", ".py", ".js", ".mjs"]
                .iter()
                .any(|x| p.ends_with(x));
            let record = p.starts_with("loadtest/results/run-");
            source && !record && !p.ends_with("Cargo.lock")
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn no_source_or_document_cites_a_file_the_repository_lacks() {
    let root = workspace_root();
    let files = tracked_sources_and_documents(&root);
    assert!(files.len() >= 100, "found only {} files", files.len());
    let mut citing = Vec::new();
    for file in &files {
        // A file deleted in the work tree but still tracked has nothing to cite.
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if cites_the_unreachable(line) {
                citing.push(format!("{file}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        citing.is_empty(),
        "say the rule or the reason itself (or link docs/architecture.md#…), not a design file, \
         a seed or an issue number the reader cannot open:\n{}",
        citing.join("\n")
    );
}

#[test]
fn a_citation_of_a_missing_file_is_found() {
    let design = ["DES", "IGN"].concat();
    let (seed, issue) = (["Se", "ed"].concat(), ["Iss", "ue"].concat());
    let issue_ = issue.to_lowercase();
    let citing = [
        format!("//! Tenancy ({design}.md §5): the caller is who the server says."),
        format!("# the hardened host config ({design} §3 \"Containers\")"),
        format!(
            "/// Which browser serves a session ({} 000 §7).",
            seed.to_lowercase()
        ),
        format!("fn browser_actions_follow_{}_000() {{", seed.to_lowercase()),
        format!("/// {issue} 23, finding 5: operators share one account."),
        format!("see {}s 13 and 14", issue.to_lowercase()),
        format!("(fixed in {} #42)", issue.to_lowercase()),
    ];
    for line in &citing {
        assert!(cites_the_unreachable(line), "not found: {line}");
    }
    let plain = [
        "/// The design of the pool: one actor owns the state.".to_string(),
        "fn noise(len: usize, seed: u32) -> Vec<u8> {".to_string(),
        "// A seeded generator; the seed is 0x9E37.".to_string(),
        "/// An issue with the socket: it may close before the reply.".to_string(),
        format!("// T{issue_} 12 and re{issue_} 3 are words, not citations."),
    ];
    for line in &plain {
        assert!(!cites_the_unreachable(line), "a false citation: {line}");
    }
}

/// The crate folders directly under `dir` (a folder with a `Cargo.toml`).
fn crate_folders(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    found.sort();
    found
}

/// The package name a manifest declares.
fn package_name(manifest: &str) -> Option<String> {
    let package = manifest.split("[package]").nth(1)?;
    let line = package
        .lines()
        .find(|l| l.trim_start().starts_with("name"))?;
    Some(line.split('"').nth(1)?.to_string())
}

/// What breaks the folder rule (docs/architecture.md#the-folder-rule) in a tree: a library in
/// `services/`, a program in `crates/`, a package not named after its folder, a library that
/// depends on a service (test-support's harness features aside: they are optional and only
/// tests turn them on).
fn folder_rule_breaks(root: &Path) -> Vec<String> {
    let mut breaks = Vec::new();
    let services: Vec<PathBuf> = crate_folders(&root.join("services"));
    let service_packages: BTreeSet<String> = services
        .iter()
        .filter_map(|dir| package_name(&std::fs::read_to_string(dir.join("Cargo.toml")).ok()?))
        .collect();
    for (folder, program) in [("services", true), ("crates", false)] {
        for dir in crate_folders(&root.join(folder)) {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let at = format!("{folder}/{name}");
            let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
            if dir.join("src/main.rs").is_file() != program || !dir.join("src/lib.rs").is_file() {
                breaks.push(if program {
                    format!("{at}: a service is a lib.rs (its run) and a main.rs")
                } else {
                    format!("{at}: a library is a lib.rs, no main.rs")
                });
            }
            if package_name(&manifest).as_deref() != Some(&*format!("sandmesh-{name}")) {
                breaks.push(format!("{at}: its package is named sandmesh-{name}"));
            }
            if !program {
                let harness = name == "test-support";
                for dep in dependencies(&manifest) {
                    let optional = manifest.lines().any(|l| {
                        l.starts_with(&format!("{dep} =")) && l.contains("optional = true")
                    });
                    if service_packages.contains(&dep) && !(harness && optional) {
                        breaks.push(format!("{at}: a library depends on the service {dep}"));
                    }
                }
            }
        }
    }
    breaks
}

#[test]
fn services_hold_programs_and_crates_hold_libraries() {
    let root = workspace_root();
    assert!(crate_folders(&root.join("services")).len() >= 10);
    assert!(crate_folders(&root.join("crates")).len() >= 10);
    let breaks = folder_rule_breaks(&root);
    assert!(breaks.is_empty(), "the folder rule: {breaks:#?}");
}

#[test]
fn a_break_of_the_folder_rule_is_found() {
    let root = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = root.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "services/good/Cargo.toml",
        "[package]\nname = \"sandmesh-good\"\n",
    );
    write("services/good/src/lib.rs", "");
    write("services/good/src/main.rs", "");
    write(
        "services/lib-only/Cargo.toml",
        "[package]\nname = \"sandmesh-lib-only\"\n",
    );
    write("services/lib-only/src/lib.rs", "");
    write(
        "crates/leans/Cargo.toml",
        "[package]\nname = \"sandmesh-leans\"\n[dependencies]\nsandmesh-good = { workspace = true }\n",
    );
    write("crates/leans/src/lib.rs", "");
    write(
        "crates/misnamed/Cargo.toml",
        "[package]\nname = \"other\"\n",
    );
    write("crates/misnamed/src/lib.rs", "");
    write(
        "crates/test-support/Cargo.toml",
        "[package]\nname = \"sandmesh-test-support\"\n[dependencies]\n\
         sandmesh-good = { workspace = true, optional = true }\n",
    );
    write("crates/test-support/src/lib.rs", "");
    let breaks = folder_rule_breaks(root.path());
    assert_eq!(
        breaks,
        [
            "services/lib-only: a service is a lib.rs (its run) and a main.rs",
            "crates/leans: a library depends on the service sandmesh-good",
            "crates/misnamed: its package is named sandmesh-misnamed",
        ]
    );
}

/// The crate folder a file belongs to: its nearest ancestor with a `Cargo.toml`.
fn owning_crate(file: &Path) -> Option<&Path> {
    file.ancestors()
        .skip(1)
        .find(|dir| dir.join("Cargo.toml").is_file())
}

/// The files a Rust source pulls in by path (`include_str!`, `include_bytes!`, `#[path]`) that
/// lie outside its own crate's folder.
fn reaches_outside_its_crate(file: &Path, text: &str) -> Vec<String> {
    let home = owning_crate(file);
    let mut outside = Vec::new();
    for needle in ["include_str!(\"", "include_bytes!(\"", "#[path = \""] {
        for rest in text.split(needle).skip(1) {
            let Some(target) = rest.split('"').next() else {
                continue;
            };
            let resolved: PathBuf = file.parent().unwrap().join(target);
            // Lexically: `..` steps up (the target need not exist for the rule to hold).
            let mut normal = PathBuf::new();
            for part in resolved.components() {
                match part {
                    std::path::Component::ParentDir => {
                        normal.pop();
                    }
                    other => normal.push(other),
                }
            }
            if home.is_none_or(|home| !normal.starts_with(home)) {
                outside.push(format!("{}: {target}", file.display()));
            }
        }
    }
    outside
}

#[test]
fn no_source_reaches_into_another_crates_folder() {
    let root = workspace_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let this = Path::new(file!()).file_name().unwrap();
    let mut outside = Vec::new();
    for file in files.iter().filter(|f| f.file_name() != Some(this)) {
        let text = std::fs::read_to_string(file).unwrap();
        outside.extend(reaches_outside_its_crate(file, &text));
    }
    assert!(
        outside.is_empty(),
        "what two crates share is a crate of its own, not a path into the other's folder: \
         {outside:#?}"
    );
}

#[test]
fn a_path_into_another_crate_is_found() {
    let root = tempfile::tempdir().unwrap();
    for krate in ["a", "b"] {
        let src = root.path().join(krate).join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(root.path().join(krate).join("Cargo.toml"), "").unwrap();
    }
    let file = root.path().join("a/src/lib.rs");
    let (inc, path) = (
        ["include", "_str!(\""].concat(),
        ["#[pa", "th = \""].concat(),
    );
    let text = format!(
        "const A: &str = {inc}own.py\");\nconst B: &str = {inc}../assets/x.css\");\n\
         const C: &str = {inc}../../b/src/k.py\");\n{path}../../b/src/m.rs\"]\nmod m;\n"
    );
    let found = reaches_outside_its_crate(&file, &text);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.iter().all(|f| f.contains("/b/src/")), "{found:?}");
}

/// Rust source with its comments, the contents of its string and character literals, and
/// its `#[cfg(test)]` items cut out: what the crate's own code (not its tests) is made of.
fn without_comments_and_tests(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let find = |from: usize, end: &str| {
        let end: Vec<char> = end.chars().collect();
        (from..chars.len())
            .find(|&i| chars[i..].starts_with(&end))
            .map_or(chars.len(), |i| i + end.len())
    };
    let mut code = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let word_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        i = match c {
            '/' if at(i + 1) == '/' => {
                code.push('\n');
                find(i, "\n")
            }
            '/' if at(i + 1) == '*' => find(i, "*/"),
            'r' if !word_before && (at(i + 1) == '"' || at(i + 1) == '#') => {
                let hashes = (i + 1..chars.len())
                    .take_while(|&j| chars[j] == '#')
                    .count();
                if at(i + 1 + hashes) != '"' {
                    code.push(c);
                    i + 1
                } else {
                    code.push_str("\"\"");
                    find(i + 2 + hashes, &format!("\"{}", "#".repeat(hashes)))
                }
            }
            '"' => {
                let mut j = i + 1;
                while j < chars.len() && chars[j] != '"' {
                    j += if chars[j] == '\\' { 2 } else { 1 };
                }
                code.push_str("\"\"");
                j + 1
            }
            // A character literal ('x', '\n'), not a lifetime ('a).
            '\'' if at(i + 1) == '\\' => {
                code.push_str("' '");
                find(i + 3, "'")
            }
            '\'' if at(i + 2) == '\'' => {
                code.push_str("' '");
                i + 3
            }
            _ => {
                code.push(c);
                i + 1
            }
        };
    }
    let mut kept = String::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..at]);
        // The item ends at its first `;` unless a `{` comes first: then at the matching `}`.
        let item = &rest[at..];
        let (semi, open) = (item.find(';'), item.find('{'));
        let end = match (semi, open) {
            (Some(s), Some(o)) if o < s => {
                let mut depth = 0;
                item[o..]
                    .char_indices()
                    .find_map(|(i, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        (depth == 0).then_some(o + i + 1)
                    })
                    .unwrap_or(item.len())
            }
            (Some(s), _) => s + 1,
            (None, _) => item.len(),
        };
        rest = &item[end..];
    }
    kept.push_str(rest);
    kept
}

/// The paths a source names from its start on (`crate::a::b::C`, `crate::{a::B, c}`): each as
/// its segments, a group split into one path per item.
fn paths_at(text: &str, prefix: &[String], found: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // Items split at the group's own commas.
            let (mut depth, mut start) = (0, 0);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        paths_at(&group[start..i], &path, found);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        paths_at(&group[start..i], &path, found);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        path.push(ident.clone());
        match rest[ident.len()..].trim_start().strip_prefix("::") {
            Some(next) => rest = next,
            None => break,
        }
    }
    found.push(path);
}

/// The module import graph of the crate whose sources are in `src`: for each module (`a::b`,
/// a file `a/b.rs` or `a/b/mod.rs`) the modules its code outside `#[cfg(test)]` names, by a
/// `crate::` path or a `super::` one resolved, each path's longest prefix that is a module.
/// The crate root (`lib.rs`, which declares and re-exports) is no node; `main.rs` and `bin/`
/// are crates of their own; a file only tests declare is left out with its tests.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let module_of = |file: &Path| -> Option<Vec<String>> {
        let rel = file.strip_prefix(src).ok()?.with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.first().is_some_and(|p| p == "bin") || parts == ["main"] {
            return None;
        }
        if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
            parts.pop();
        }
        Some(parts)
    };
    let sources: BTreeMap<Vec<String>, String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).ok()?;
            Some((module_of(f)?, without_comments_and_tests(&text)))
        })
        .collect();
    // A module is compiled outside tests when the nearest file above it declares the next
    // step down (`mod x;` or `mod x {`) outside `#[cfg(test)]`.
    let live = |module: &[String]| {
        (0..module.len()).all(|depth| {
            let parent = (0..=depth)
                .rev()
                .find_map(|d| sources.get(&module[..d]).map(|text| (d, text)));
            parent.is_none_or(|(d, text)| {
                let declared = |sep| text.contains(&format!("mod {}{sep}", module[d]));
                d < depth || declared(";") || declared(" {")
            })
        })
    };
    let modules: BTreeSet<&Vec<String>> = sources
        .keys()
        .filter(|m| !m.is_empty() && live(m))
        .collect();
    let mut graph = BTreeMap::new();
    for module in &modules {
        let text = &sources[*module];
        let mut paths = Vec::new();
        for (needle, base) in [
            ("crate::", Vec::new()),
            ("super::", module[..module.len() - 1].to_vec()),
        ] {
            let mut at = 0;
            while let Some(i) = text[at..].find(needle) {
                let start = at + i;
                at = start + needle.len();
                let before = text[..start].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                // `super::super::x` climbs once per `super`.
                let mut base = base.clone();
                let mut rest = &text[at..];
                while let Some(next) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = next;
                }
                paths_at(rest, &base, &mut paths);
            }
        }
        let mut targets = BTreeSet::new();
        for path in paths {
            let target = (1..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|p| modules.contains(&p.to_vec()));
            if let Some(target) = target.filter(|t| *t != module.as_slice()) {
                targets.insert(target.join("::"));
            }
        }
        graph.insert(module.join("::"), targets);
    }
    graph
}

/// The cycles of a module graph, each named by one loop through it (`a → b → a`), one per
/// strongly connected group of modules.
fn module_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let reaches = |from: &str, to: &str| -> Option<Vec<String>> {
        // Breadth first, so the loop named is a shortest one.
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from]);
        while let Some(at) = queue.pop_front() {
            for next in graph.get(at).into_iter().flatten() {
                if next == to {
                    let mut path = vec![to.to_string(), at.to_string()];
                    let mut step = at;
                    while step != from {
                        step = came_from[step];
                        path.push(step.to_string());
                    }
                    path.reverse();
                    return Some(path);
                }
                if next != from && !came_from.contains_key(next.as_str()) {
                    came_from.insert(next, at);
                    queue.push_back(next);
                }
            }
        }
        None
    };
    let mut seen = BTreeSet::new();
    let mut cycles = Vec::new();
    for module in graph.keys() {
        if seen.contains(module) {
            continue;
        }
        if let Some(path) = reaches(module, module) {
            // The whole group: every module on a loop through this one.
            let group: Vec<&String> = graph
                .keys()
                .filter(|m| reaches(module, m).is_some() && reaches(m, module).is_some())
                .collect();
            seen.extend(group.iter().map(|m| m.to_string()));
            cycles.push(format!(
                "{} ({} modules in the group)",
                path.join(" → "),
                group.len()
            ));
        }
    }
    cycles
}

/// Every crate of the workspace's own code whose modules must be layered
/// (docs/architecture.md#the-folder-rule): the libraries, the services, the programs that run
/// inside a sandbox, the CLI and the loadtest. Each module imports only modules below it, so
/// the code reads bottom-up and a change reaches only what sits above it.
fn layered_crates(root: &Path) -> Vec<PathBuf> {
    let mut crates = crate_folders(&root.join("crates"));
    crates.extend(crate_folders(&root.join("services")));
    crates.extend(crate_folders(&root.join("sandbox")));
    crates.extend(["cli", "loadtest"].map(|c| root.join(c)));
    crates
}

#[test]
fn no_crate_imports_a_module_cycle() {
    let root = workspace_root();
    let crates = layered_crates(&root);
    let mut cycles = Vec::new();
    let mut modules = 0;
    for krate in &crates {
        let graph = module_graph(&krate.join("src"));
        modules += graph.len();
        let name = krate.strip_prefix(&root).unwrap().display().to_string();
        cycles.extend(
            module_cycles(&graph)
                .into_iter()
                .map(|c| format!("{name}: {c}")),
        );
    }
    // The walk reads the real tree: the scheduler alone has dozens of modules.
    let scheduler = module_graph(&root.join("services/scheduler/src"));
    assert!(scheduler.len() >= 10, "found only {scheduler:?}");
    assert!(
        crates.len() >= 20 && modules >= 150,
        "{} crates, {modules} modules",
        crates.len()
    );
    assert!(
        cycles.is_empty(),
        "a module imports one above it (move what both need down, or hand the lower one a \
         callback): {cycles:#?}"
    );
}

#[test]
fn a_module_cycle_is_found() {
    let root = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = root.path().join("src").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "lib.rs",
        "pub mod a;\npub mod b;\npub mod c;\npub use a::A;\n",
    );
    write("a.rs", "use crate::{c, b::{x::X, Y}};\npub struct A;\n");
    write(
        "b/mod.rs",
        "pub mod x;\npub struct Y;\n#[cfg(test)]\nmod props;\n",
    );
    // Up to the root and down again: b::x → a.
    write("b/x.rs", "pub struct X(super::super::a::A);\n");
    // Named only in a comment, a string and tests: no edge.
    write(
        "c.rs",
        "// crate::a::A\nconst S: &str = \"crate::a::A {\";\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n    fn f() { let _ = A; }\n}\n",
    );
    write("b/props.rs", "use crate::a::A;\n");
    let graph = module_graph(&root.path().join("src"));
    let edges = |m: &str| graph[m].iter().map(String::as_str).collect::<Vec<_>>();
    assert_eq!(graph.keys().collect::<Vec<_>>(), ["a", "b", "b::x", "c"]);
    assert_eq!(edges("a"), ["b", "b::x", "c"]);
    assert_eq!(edges("b::x"), ["a"]);
    assert!(edges("c").is_empty() && edges("b").is_empty());
    assert_eq!(
        module_cycles(&graph),
        ["a → b::x → a (2 modules in the group)"]
    );
    // Made acyclic, the same tree passes.
    write("b/x.rs", "pub struct X;\n");
    assert!(module_cycles(&module_graph(&root.path().join("src"))).is_empty());
}
