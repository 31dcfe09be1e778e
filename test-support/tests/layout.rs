//! The workspace's crates build one integration-test binary each (`autotests = false`,
//! `tests/main.rs` declaring every file of `tests/` as a module). Cargo then ignores a file
//! that `main.rs` does not name: this test fails instead of the file's tests silently never
//! running.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support sits in the workspace root")
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
