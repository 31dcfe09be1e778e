//! `/v1/file/{replace,search,find,str_replace_editor}`: the text tools an agent edits code
//! with, on the same workspace paths (and the same refusals) as the other file calls.
//!
//! Patterns never backtrack: `search`'s regex and `find`'s glob (translated to a regex) run
//! on the `regex` crate, linear in the input, with a bounded compiled size, so a hostile
//! pattern costs no more than a plain one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::files::{EditError, FileError, Workspace};

/// Largest compiled pattern (the regex crate's own default is 10 MiB).
const MAX_PATTERN_BYTES: usize = 1 << 20;
/// Most entries `find` looks at, and most it returns.
const MAX_FIND_VISITS: usize = 100_000;
const MAX_FIND_RESULTS: usize = 10_000;
/// Most undo steps kept per file, and most files with any.
const MAX_UNDO_STEPS: usize = 10;
const MAX_UNDO_FILES: usize = 256;

#[derive(Debug, Deserialize)]
pub struct FileReplaceRequest {
    pub file: String,
    pub old_str: String,
    pub new_str: String,
}

#[derive(Debug, Serialize)]
pub struct FileReplaceResult {
    pub file: String,
    pub replaced_count: usize,
}

#[derive(Debug, Deserialize)]
pub struct FileSearchRequest {
    pub file: String,
    pub regex: String,
}

/// `line_numbers` are 0-based, as `/v1/file/read`'s `start_line`.
#[derive(Debug, Serialize)]
pub struct FileSearchResult {
    pub file: String,
    pub matches: Vec<String>,
    pub line_numbers: Vec<usize>,
}

#[derive(Debug, Deserialize)]
pub struct FileFindRequest {
    pub path: String,
    pub glob: String,
}

#[derive(Debug, Serialize)]
pub struct FileFindResult {
    pub path: String,
    pub files: Vec<String>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EditorCommand {
    View,
    Create,
    StrReplace,
    Insert,
    UndoEdit,
}

#[derive(Debug, Deserialize)]
pub struct StrReplaceEditorRequest {
    pub command: EditorCommand,
    pub path: String,
    #[serde(default)]
    pub file_text: Option<String>,
    #[serde(default)]
    pub old_str: Option<String>,
    #[serde(default)]
    pub new_str: Option<String>,
    #[serde(default)]
    pub insert_line: Option<usize>,
    #[serde(default)]
    pub view_range: Option<Vec<i64>>,
    #[serde(default)]
    pub replace_mode: Option<String>,
}

/// On failure too (`error` set, `success: false`): the SDK reads this route's `data` as this
/// type only, never as `FileOperationError`, whose `error_type` is added beside it.
#[derive(Debug, Serialize)]
pub struct StrReplaceEditorResult {
    pub output: String,
    pub error: Option<String>,
    pub path: String,
    pub prev_exist: bool,
    pub old_content: Option<String>,
    pub new_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<&'static str>,
}

/// The tools, and the undo history `str_replace_editor` keeps (in memory: an agent's edits
/// of one instance's files).
pub struct Editor {
    workspace: Workspace,
    history: Mutex<HashMap<PathBuf, Vec<String>>>,
}

impl Editor {
    pub fn new(workspace: Workspace) -> Self {
        Self {
            workspace,
            history: Mutex::new(HashMap::new()),
        }
    }

    fn read_text(&self, path: &Path) -> Result<String, FileError> {
        let bytes = self.workspace.read_bytes(path)?;
        String::from_utf8(bytes).map_err(|_| EditError::NotText(path.display().to_string()).into())
    }

    pub fn replace(&self, req: &FileReplaceRequest) -> Result<FileReplaceResult, FileError> {
        let path = self.workspace.resolve(&req.file)?;
        let text = self.read_text(&path)?;
        if req.old_str.is_empty() {
            return Err(EditError::Missing("old_str").into());
        }
        let replaced_count = text.matches(&req.old_str).count();
        if replaced_count > 0 {
            let new = text.replace(&req.old_str, &req.new_str);
            self.workspace.write_bytes(&path, new.as_bytes(), false)?;
        }
        Ok(FileReplaceResult {
            file: path.display().to_string(),
            replaced_count,
        })
    }

    pub fn search(&self, req: &FileSearchRequest) -> Result<FileSearchResult, FileError> {
        let path = self.workspace.resolve(&req.file)?;
        let regex = compile(&req.regex)?;
        let bytes = self.workspace.read_bytes(&path)?;
        let text = String::from_utf8_lossy(&bytes);
        let (line_numbers, matches) = text
            .lines()
            .enumerate()
            .filter(|(_, line)| regex.is_match(line))
            .map(|(n, line)| (n, line.to_string()))
            .unzip();
        Ok(FileSearchResult {
            file: path.display().to_string(),
            matches,
            line_numbers,
        })
    }

    /// Files under `path` whose path relative to it matches the glob (`*` and `?` within one
    /// component, `**/` any number of directories, `[...]` classes), as Python's
    /// `glob(path/glob, recursive=True)` finds them. Symlinks are matched, never followed.
    pub fn find(&self, req: &FileFindRequest) -> Result<FileFindResult, FileError> {
        let dir = self.workspace.resolve(&req.path)?;
        let pattern = compile(&glob_to_regex(&req.glob))?;
        let mut files = Vec::new();
        let mut visits = 0;
        let mut stack = vec![dir.clone()];
        while let Some(current) = stack.pop() {
            let entries = std::fs::read_dir(&current).map_err(|source| FileError::Io {
                op: "list",
                path: current.display().to_string(),
                source,
            })?;
            for entry in entries.flatten() {
                visits += 1;
                if visits > MAX_FIND_VISITS || files.len() >= MAX_FIND_RESULTS {
                    stack.clear();
                    break;
                }
                let path = entry.path();
                let Ok(relative) = path.strip_prefix(&dir) else {
                    continue;
                };
                if pattern.is_match(&relative.to_string_lossy()) {
                    files.push(path.display().to_string());
                }
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(path);
                }
            }
        }
        files.sort();
        Ok(FileFindResult {
            path: dir.display().to_string(),
            files,
        })
    }

    pub fn str_replace_editor(
        &self,
        req: &StrReplaceEditorRequest,
    ) -> Result<StrReplaceEditorResult, FileError> {
        let path = self.workspace.resolve(&req.path)?;
        let shown = path.display().to_string();
        let meta = std::fs::metadata(&path).ok();
        let prev_exist = meta.is_some();
        if meta.as_ref().is_some_and(|m| m.is_dir()) {
            if req.command != EditorCommand::View {
                return Err(EditError::Directory(shown).into());
            }
            return Ok(self.view_directory(&path, shown));
        }
        let result =
            |output: String, old: Option<String>, new: Option<String>| StrReplaceEditorResult {
                output,
                error: None,
                path: shown.clone(),
                prev_exist,
                old_content: old,
                new_content: new,
                error_type: None,
            };
        match req.command {
            EditorCommand::View => {
                let text = self.read_text(&path)?;
                let (first, lines) = view_window(&text, req.view_range.as_deref())?;
                Ok(result(
                    format!(
                        "Here's the result of running `cat -n` on {shown}:\n{}",
                        numbered(&lines, first)
                    ),
                    None,
                    None,
                ))
            }
            EditorCommand::Create => {
                let text = req
                    .file_text
                    .as_ref()
                    .ok_or(EditError::Missing("file_text"))?;
                if prev_exist {
                    return Err(EditError::Exists(shown).into());
                }
                self.workspace.write_bytes(&path, text.as_bytes(), false)?;
                Ok(result(
                    format!("File created successfully at: {shown}"),
                    None,
                    Some(text.clone()),
                ))
            }
            EditorCommand::StrReplace => {
                let old_str = req
                    .old_str
                    .as_deref()
                    .ok_or(EditError::Missing("old_str"))?;
                let new_str = req.new_str.as_deref().unwrap_or("");
                let text = self.read_text(&path)?;
                let lines: Vec<usize> = text
                    .match_indices(old_str)
                    .map(|(at, _)| text[..at].matches('\n').count() + 1)
                    .collect();
                let all = req.replace_mode.as_deref() == Some("ALL");
                let new = match lines.len() {
                    0 => return Err(EditError::NotFound(shown).into()),
                    1 => text.replacen(old_str, new_str, 1),
                    _ if all => text.replace(old_str, new_str),
                    _ => return Err(EditError::NotUnique { path: shown, lines }.into()),
                };
                self.commit(&path, &text, &new)?;
                let first_line = lines[0];
                let snippet: Vec<&str> = new.lines().collect();
                let from = first_line.saturating_sub(4).max(1);
                let to = (first_line + new_str.matches('\n').count() + 4).min(snippet.len());
                Ok(result(
                    format!(
                        "The file {shown} has been edited. Here's the result of running `cat -n` \
                         on a snippet of {shown}:\n{}",
                        numbered(&snippet[(from - 1).min(to)..to], from)
                    ),
                    Some(text),
                    Some(new),
                ))
            }
            EditorCommand::Insert => {
                let at = req.insert_line.ok_or(EditError::Missing("insert_line"))?;
                let new_str = req
                    .new_str
                    .as_deref()
                    .ok_or(EditError::Missing("new_str"))?;
                let text = self.read_text(&path)?;
                let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
                if at > lines.len() {
                    return Err(EditError::Range("insert_line is past the end of the file").into());
                }
                let mut inserted = new_str.to_string();
                if !inserted.ends_with('\n') {
                    inserted.push('\n');
                }
                // The line before keeps its own end: a last line without one gets one.
                let ended: String;
                if at > 0 && !lines[at - 1].ends_with('\n') {
                    ended = format!("{}\n", lines[at - 1]);
                    lines[at - 1] = &ended;
                }
                lines.insert(at, &inserted);
                let new: String = lines.concat();
                self.commit(&path, &text, &new)?;
                Ok(result(
                    format!("The file {shown} has been edited: text inserted after line {at}."),
                    Some(text),
                    Some(new),
                ))
            }
            EditorCommand::UndoEdit => {
                let previous = self
                    .history()
                    .get_mut(&path)
                    .and_then(Vec::pop)
                    .ok_or_else(|| EditError::NoHistory(shown.clone()))?;
                let current = self.read_text(&path).ok();
                self.workspace
                    .write_bytes(&path, previous.as_bytes(), false)?;
                Ok(result(
                    format!("Last edit to {shown} undone successfully."),
                    current,
                    Some(previous),
                ))
            }
        }
    }

    fn history(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Vec<String>>> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `new` and remembers `old` for `undo_edit`.
    fn commit(&self, path: &Path, old: &str, new: &str) -> Result<(), FileError> {
        self.workspace.write_bytes(path, new.as_bytes(), false)?;
        let mut history = self.history();
        if !history.contains_key(path) && history.len() >= MAX_UNDO_FILES {
            history.clear();
        }
        let steps = history.entry(path.to_path_buf()).or_default();
        if steps.len() >= MAX_UNDO_STEPS {
            steps.remove(0);
        }
        steps.push(old.to_string());
        Ok(())
    }

    fn view_directory(&self, dir: &Path, shown: String) -> StrReplaceEditorResult {
        let mut entries = Vec::new();
        let mut stack = vec![(dir.to_path_buf(), 1)];
        while let Some((current, depth)) = stack.pop() {
            for entry in std::fs::read_dir(&current).into_iter().flatten().flatten() {
                if entries.len() >= MAX_FIND_RESULTS {
                    break;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                let path = entry.path();
                if depth < 2 && entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((path.clone(), depth + 1));
                }
                entries.push(path.display().to_string());
            }
        }
        entries.sort();
        StrReplaceEditorResult {
            output: format!(
                "Here's the files and directories up to 2 levels deep in {shown}, excluding \
                 hidden items:\n{}\n",
                entries.join("\n")
            ),
            error: None,
            path: shown,
            prev_exist: true,
            old_content: None,
            new_content: None,
            error_type: None,
        }
    }
}

fn compile(pattern: &str) -> Result<regex::Regex, FileError> {
    regex::RegexBuilder::new(pattern)
        .size_limit(MAX_PATTERN_BYTES)
        .build()
        .map_err(|e| EditError::Pattern(e).into())
}

/// The lines `view_range` (1-based, inclusive, `-1` for the end) selects, and the number of
/// the first.
fn view_window<'a>(
    text: &'a str,
    range: Option<&[i64]>,
) -> Result<(usize, Vec<&'a str>), EditError> {
    let lines: Vec<&str> = text.lines().collect();
    let (start, end) = match range {
        None | Some([]) => return Ok((1, lines)),
        Some([start, end]) => (*start, *end),
        Some(_) => return Err(EditError::Range("view_range must be [start, end]")),
    };
    let n = lines.len() as i64;
    let end = if end == -1 { n } else { end };
    if start < 1 || start > n.max(1) || end < start || end > n {
        return Err(EditError::Range(
            "view_range must lie within the file's lines (1-based, end -1 for the last)",
        ));
    }
    Ok((
        start as usize,
        lines[(start - 1) as usize..end as usize].to_vec(),
    ))
}

/// `cat -n`'s format.
fn numbered(lines: &[&str], first: usize) -> String {
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| format!("{:6}\t{l}\n", first + i))
        .collect()
}

/// A glob as an anchored regex over a relative path.
fn glob_to_regex(glob: &str) -> String {
    let mut re = String::from("^");
    let chars: Vec<char> = glob.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' if chars.get(i + 1) == Some(&'*') => {
                if chars.get(i + 2) == Some(&'/') {
                    re.push_str("(?:.*/)?");
                    i += 3;
                } else {
                    re.push_str(".*");
                    i += 2;
                }
                continue;
            }
            '*' => re.push_str("[^/]*"),
            '?' => re.push_str("[^/]"),
            '[' => match chars[i + 1..].iter().position(|&c| c == ']') {
                // `[]` and `[!]` have no class: the bracket is literal.
                Some(len) if len > 0 && !(len == 1 && chars[i + 1] == '!') => {
                    let class: String = chars[i + 1..i + 1 + len].iter().collect();
                    let (negate, body) = match class.strip_prefix('!') {
                        Some(rest) => ("^", rest.to_string()),
                        None => ("", class),
                    };
                    let body = body.replace('\\', "\\\\").replace('[', "\\[");
                    re.push_str(&format!("[{negate}{body}]"));
                    i += len + 2;
                    continue;
                }
                _ => re.push_str("\\["),
            },
            c => re.push_str(&regex::escape(&c.to_string())),
        }
        i += 1;
    }
    re.push('$');
    re
}

#[cfg(test)]
mod tests {
    use super::*;

    fn editor() -> (tempfile::TempDir, Editor) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path(), 1 << 20).unwrap();
        (dir, Editor::new(ws))
    }

    fn matches(glob: &str, path: &str) -> bool {
        regex::Regex::new(&glob_to_regex(glob))
            .unwrap()
            .is_match(path)
    }

    #[test]
    fn globs_follow_python_recursive_glob() {
        assert!(matches("*.py", "a.py"));
        assert!(!matches("*.py", "d/a.py"));
        assert!(matches("**/*.py", "a.py"));
        assert!(matches("**/*.py", "d/e/a.py"));
        assert!(matches("d/?.txt", "d/x.txt"));
        assert!(!matches("d/?.txt", "d/xy.txt"));
        assert!(matches("[ab]*.rs", "b1.rs"));
        assert!(!matches("[!ab]*.rs", "b1.rs"));
        assert!(matches("a.(b)+", "a.(b)+"));
        assert!(matches("[", "["));
        assert!(matches("[]", "[]"));
    }

    #[test]
    fn replace_search_and_find() {
        let (dir, ed) = editor();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.py"), "x = 1\ny = x\nx = 2\n").unwrap();
        std::fs::write(dir.path().join("b.txt"), "").unwrap();
        let replaced = ed
            .replace(&FileReplaceRequest {
                file: "sub/a.py".into(),
                old_str: "x =".into(),
                new_str: "z =".into(),
            })
            .unwrap();
        assert_eq!(replaced.replaced_count, 2);
        let found = ed
            .search(&FileSearchRequest {
                file: "sub/a.py".into(),
                regex: r"^z = \d$".into(),
            })
            .unwrap();
        assert_eq!(found.line_numbers, [0, 2]);
        assert_eq!(found.matches, ["z = 1", "z = 2"]);
        let find = |glob: &str| {
            ed.find(&FileFindRequest {
                path: ".".into(),
                glob: glob.into(),
            })
            .unwrap()
            .files
            .len()
        };
        assert_eq!((find("**/*.py"), find("*.py"), find("*")), (1, 0, 2));
        // A pattern that backtracking engines take exponential time on.
        std::fs::write(dir.path().join("b.txt"), "a".repeat(5000) + "!").unwrap();
        let found = ed
            .search(&FileSearchRequest {
                file: "b.txt".into(),
                regex: "^(a+)+$".into(),
            })
            .unwrap();
        assert!(found.matches.is_empty());
        assert!(matches!(
            ed.search(&FileSearchRequest {
                file: "b.txt".into(),
                regex: "(".into(),
            }),
            Err(FileError::Edit(EditError::Pattern(_)))
        ));
    }

    fn request(command: EditorCommand, path: &str) -> StrReplaceEditorRequest {
        StrReplaceEditorRequest {
            command,
            path: path.into(),
            file_text: None,
            old_str: None,
            new_str: None,
            insert_line: None,
            view_range: None,
            replace_mode: None,
        }
    }

    #[test]
    fn the_editor_creates_views_replaces_inserts_and_undoes() {
        let (dir, ed) = editor();
        let mut create = request(EditorCommand::Create, "f.py");
        create.file_text = Some("a\nb\nb\n".into());
        assert!(!ed.str_replace_editor(&create).unwrap().prev_exist);
        assert!(matches!(
            ed.str_replace_editor(&create),
            Err(FileError::Edit(EditError::Exists(_)))
        ));
        let mut view = request(EditorCommand::View, "f.py");
        view.view_range = Some(vec![2, -1]);
        let out = ed.str_replace_editor(&view).unwrap().output;
        assert!(out.ends_with("     2\tb\n     3\tb\n"), "{out}");
        let mut replace = request(EditorCommand::StrReplace, "f.py");
        replace.old_str = Some("b".into());
        replace.new_str = Some("c".into());
        assert!(matches!(
            ed.str_replace_editor(&replace),
            Err(FileError::Edit(EditError::NotUnique { ref lines, .. })) if lines == &[2, 3]
        ));
        replace.old_str = Some("a\n".into());
        ed.str_replace_editor(&replace).unwrap();
        let mut insert = request(EditorCommand::Insert, "f.py");
        insert.insert_line = Some(1);
        insert.new_str = Some("X".into());
        ed.str_replace_editor(&insert).unwrap();
        let content = || std::fs::read_to_string(dir.path().join("f.py")).unwrap();
        assert_eq!(content(), "cb\nX\nb\n");
        ed.str_replace_editor(&request(EditorCommand::UndoEdit, "f.py"))
            .unwrap();
        assert_eq!(content(), "cb\nb\n");
        ed.str_replace_editor(&request(EditorCommand::UndoEdit, "f.py"))
            .unwrap();
        assert_eq!(content(), "a\nb\nb\n");
        assert!(matches!(
            ed.str_replace_editor(&request(EditorCommand::UndoEdit, "f.py")),
            Err(FileError::Edit(EditError::NoHistory(_)))
        ));
        view.view_range = Some(vec![0, 9]);
        assert!(ed.str_replace_editor(&view).is_err());
        let dir_view = ed
            .str_replace_editor(&request(EditorCommand::View, "."))
            .unwrap();
        assert!(dir_view.output.contains("f.py"));
    }
}
