//! Property tests of `parse`: hostile archives built byte by byte.

use proptest::prelude::*;
use tar::{Builder, EntryType, Header};

use super::*;

/// How an entry's name reaches the reader.
#[derive(Debug, Clone, Copy)]
enum Naming {
    Header,
    GnuLongName,
    Pax,
}

#[derive(Debug, Clone)]
struct Raw {
    kind: EntryType,
    name: String,
    naming: Naming,
    link: String,
    data: Vec<u8>,
}

fn kind() -> impl Strategy<Value = EntryType> {
    prop_oneof![
        4 => Just(EntryType::Regular),
        2 => Just(EntryType::Directory),
        1 => Just(EntryType::Symlink),
        1 => Just(EntryType::Link),
        1 => Just(EntryType::Char),
        1 => Just(EntryType::Block),
        1 => Just(EntryType::Fifo),
    ]
}

/// Names as a hostile archive has them: climbing, absolute, `./`-prefixed, long.
fn name() -> impl Strategy<Value = String> {
    let component = prop_oneof![
        4 => "[a-z]{1,6}",
        2 => Just("..".to_string()),
        1 => Just(".".to_string()),
        1 => Just(String::new()),
        1 => Just("x".repeat(120)),
    ];
    let lead = prop_oneof![Just(""), Just("/"), Just("./"), Just("././")];
    (lead, proptest::collection::vec(component, 1..5))
        .prop_map(|(lead, parts)| format!("{lead}{}", parts.join("/")))
}

fn entry() -> impl Strategy<Value = Raw> {
    let naming = prop_oneof![
        Just(Naming::Header),
        Just(Naming::GnuLongName),
        Just(Naming::Pax)
    ];
    let data = proptest::collection::vec(any::<u8>(), 0..64);
    (kind(), name(), naming, name(), data).prop_map(|(kind, name, naming, link, data)| {
        // A header holds 100 bytes of name: longer ones always travel in a record.
        let naming = match naming {
            Naming::Header if name.len() > 100 => Naming::GnuLongName,
            n => n,
        };
        Raw {
            kind,
            name,
            naming,
            link,
            data,
        }
    })
}

fn pax_record(key: &str, value: &str) -> Vec<u8> {
    // The length prefix counts itself.
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}

/// A header written byte by byte: the tar crate's own setters refuse `..` and absolute
/// names, which is exactly what an attacker's archive contains.
fn header(kind: EntryType, name: &[u8], link: &[u8], size: u64) -> Header {
    let mut h = Header::new_gnu();
    let gnu = h.as_gnu_mut().expect("a GNU header");
    let n = name.len().min(gnu.name.len());
    gnu.name[..n].copy_from_slice(&name[..n]);
    let l = link.len().min(gnu.linkname.len());
    gnu.linkname[..l].copy_from_slice(&link[..l]);
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    h
}

fn archive(entries: &[Raw]) -> Vec<u8> {
    let mut b = Builder::new(Vec::new());
    for e in entries {
        let data: &[u8] = if e.kind == EntryType::Regular {
            &e.data
        } else {
            &[]
        };
        let mut record = |kind, payload: Vec<u8>| {
            let h = header(kind, b"././@LongLink", b"", payload.len() as u64);
            b.append(&h, &payload[..]).unwrap();
        };
        match e.naming {
            Naming::Header => {}
            Naming::GnuLongName => record(EntryType::GNULongName, e.name.clone().into_bytes()),
            Naming::Pax => record(EntryType::XHeader, pax_record("path", &e.name)),
        }
        let h = header(
            e.kind,
            e.name.as_bytes(),
            e.link.as_bytes(),
            data.len() as u64,
        );
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

fn parse_all(bytes: &[u8]) -> Result<Staged> {
    let limits = Limits {
        max_entries: 1_000,
        max_bytes: 1 << 20,
    };
    parse(bytes, limits, &mut |_| Ok("object".to_string()))
}

/// Would this name land outside the root: absolute, or a `..` component?
fn escapes(name: &str) -> bool {
    name.starts_with('/') || name.split('/').any(|c| c == "..")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever the entries, a parsed archive holds only plain files and directories
    /// inside the root; one link, device, fifo or escaping name refuses it whole.
    #[test]
    fn nothing_outside_the_root_and_no_link_is_ever_staged(
        entries in proptest::collection::vec(entry(), 1..8),
    ) {
        let hostile = entries.iter().any(|e| {
            !matches!(e.kind, EntryType::Regular | EntryType::Directory) || escapes(&e.name)
        });
        match parse_all(&archive(&entries)) {
            Ok(staged) => {
                prop_assert!(!hostile, "accepted {:?}", entries);
                for path in staged.files.keys().chain(&staged.dirs) {
                    for part in path.parts() {
                        prop_assert!(!part.is_empty() && part != "." && part != "..");
                        prop_assert!(!part.contains('/'));
                    }
                }
            }
            // Refused as a bad request, never failed as the store's own fault.
            Err(e) => prop_assert!(matches!(e, StoreError::BadRequest(_)), "{:?}", e),
        }
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = parse_all(&bytes);
    }
}
