//! What of a run's file changes its session's workspace takes. The store takes a push whole or
//! not at all, so one name it refuses (a newline, a backslash, an encoded `..`: legal on Linux,
//! as an unpacked zip may make them) would lose every change of the run. Each name is held here
//! to the store's own rule (`messages::validate::validate_relative_path`) before the push:
//! refused files are reported by name and left out, the others saved.
//!
//! The supervisor runs next to the untrusted code, so its archive is screened entry by entry,
//! not only the names its report gives.

use std::collections::HashSet;
use std::io::Read;

use messages::exec::RefusedFile;
use messages::validate::validate_relative_path;
use messages::ErrorBody;
use sandbox_protocol::{RunReport, MAX_CHANGED_PATHS, MAX_CHANGE_LIST_BYTES};

/// Why a file left out for size was not saved.
const TOO_LARGE: &str = "not carried back: the run's changed files together passed the size \
                         one run may save";

/// The run's created and modified files as its result lists them: those saved, and those
/// refused with why.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Screened {
    pub created: Vec<String>,
    pub modified: Vec<String>,
    pub refused: Vec<RefusedFile>,
}

/// Sorts the report's created and modified files into saved and refused: a name the workspace
/// refuses, or a file the supervisor left out of the archive for size.
pub fn screen(report: &RunReport) -> Screened {
    let skipped: HashSet<&str> = report.files_skipped.iter().map(String::as_str).collect();
    let mut screened = Screened::default();
    let mut sort = |paths: &[String], saved: &mut Vec<String>| {
        for path in paths {
            match validate_relative_path("path", path) {
                Err(e) => screened_out(&mut screened.refused, path, refusal(e)),
                Ok(()) if skipped.contains(path.as_str()) => {
                    screened_out(&mut screened.refused, path, TOO_LARGE.into())
                }
                Ok(()) => saved.push(path.clone()),
            }
        }
    };
    let (mut created, mut modified) = (Vec::new(), Vec::new());
    sort(&report.files_created, &mut created);
    sort(&report.files_modified, &mut modified);
    screened.created = created;
    screened.modified = modified;
    screened
}

fn screened_out(refused: &mut Vec<RefusedFile>, path: &str, reason: String) {
    refused.push(RefusedFile {
        path: path.to_string(),
        reason,
    });
}

fn refusal(e: messages::validate::ValidationError) -> String {
    match e {
        messages::validate::ValidationError::Invalid { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// The error a result carries when the run changed more files than one run saves.
pub fn omitted_error(omitted: u64) -> ErrorBody {
    ErrorBody::too_large(format!(
        "the run changed more files than one run saves (at most {MAX_CHANGED_PATHS} changes, \
         with {} KiB of names): {omitted} changes, those farthest from the workspace's root, \
         were not saved",
        MAX_CHANGE_LIST_BYTES / 1024
    ))
    .with_details(serde_json::json!({
        "files_omitted": omitted,
        "max_changed_paths": MAX_CHANGED_PATHS,
        "max_change_list_bytes": MAX_CHANGE_LIST_BYTES,
    }))
}

/// The changes archive without the entries whose names the workspace refuses (the same
/// bytes when there are none, which is the usual case: no copy; nothing when every name is
/// refused, so nothing is pushed). An archive that cannot be read is handed on as it is, for
/// the store to refuse with its own error.
pub fn screen_archive(tar: Vec<u8>) -> Vec<u8> {
    match refused_entries(&tar) {
        Ok((0, _)) | Err(_) => tar,
        Ok((refused, total)) if refused == total => Vec::new(),
        Ok(_) => rebuilt(&tar).unwrap_or(tar),
    }
}

/// The name of an archive entry, when the workspace takes it.
fn accepted(entry: &tar::Entry<'_, &[u8]>) -> Option<String> {
    let path = entry.path().ok()?;
    let path = path.to_str()?;
    validate_relative_path("path", path)
        .is_ok()
        .then(|| path.to_string())
}

/// (refused entries, all entries) of an archive.
fn refused_entries(tar: &[u8]) -> std::io::Result<(usize, usize)> {
    let mut archive = tar::Archive::new(tar);
    let (mut refused, mut total) = (0, 0);
    for entry in archive.entries()? {
        total += 1;
        if accepted(&entry?).is_none() {
            refused += 1;
        }
    }
    Ok((refused, total))
}

fn rebuilt(tar: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut archive = tar::Archive::new(tar);
    let mut out = tar::Builder::new(Vec::with_capacity(tar.len()));
    for entry in archive.entries()? {
        let mut entry = entry?;
        let Some(path) = accepted(&entry) else {
            continue;
        };
        let mut header = entry.header().clone();
        let mut data = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut data)?;
        out.append_data(&mut header, path, data.as_slice())?;
    }
    out.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar as the supervisor packs it (the tar crate writes these names as they are).
    fn tar_of(names: &[&str]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for name in names {
            let mut h = tar::Header::new_gnu();
            h.set_size(name.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, name, name.as_bytes()).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn names(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (e.path().unwrap().to_str().unwrap().to_string(), data)
            })
            .collect()
    }

    const ODD: [&str; 4] = [
        "weird\nname.txt",
        "back\\slash.txt",
        "%2e%2e%2fescape.txt",
        "evil\u{202E}txt.exe",
    ];

    #[test]
    fn refused_names_leave_the_archive_and_the_rest_stays_byte_for_byte() {
        let long = format!("deep/{}/result.csv", "d".repeat(120));
        let mut all = vec!["important_result.csv", long.as_str()];
        all.extend(ODD);
        let screened = names(&screen_archive(tar_of(&all)));
        assert_eq!(
            screened,
            vec![
                (
                    "important_result.csv".to_string(),
                    b"important_result.csv".to_vec()
                ),
                (long.clone(), long.as_bytes().to_vec()),
            ]
        );
        // Positive control: an archive with nothing refused is handed on untouched.
        let clean = tar_of(&["important_result.csv", long.as_str()]);
        assert_eq!(screen_archive(clean.clone()), clean);
        // Only refused names: nothing to push.
        assert!(screen_archive(tar_of(&ODD)).is_empty());
    }

    #[test]
    fn the_result_lists_saved_and_refused_files_apart() {
        let mut report = RunReport::failed("");
        report.files_created = ["big.bin", "important_result.csv"]
            .into_iter()
            .chain(ODD)
            .map(String::from)
            .collect();
        report.files_modified = vec!["data/in.txt".into()];
        report.files_skipped = vec!["big.bin".into()];
        let s = screen(&report);
        assert_eq!(s.created, vec!["important_result.csv"]);
        assert_eq!(s.modified, vec!["data/in.txt"]);
        let refused: Vec<&str> = s.refused.iter().map(|r| r.path.as_str()).collect();
        let mut expected = vec!["big.bin"];
        expected.extend(ODD);
        assert_eq!(refused, expected);
        assert!(s.refused.iter().all(|r| !r.reason.is_empty()));
    }
}
