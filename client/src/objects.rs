//! Reading objects of a JetStream object store chunk by chunk with direct gets.
//!
//! async-nats' `ObjectStore::get` creates an ordered consumer for every read, which the server
//! keeps until its inactivity threshold passes; under a steady read rate they pile up until the
//! server refuses new ones ("maximum consumers limit reached") and every read fails. A chunk is
//! one message on `$O.<bucket>.C.<nuid>`, so reading the chunks in sequence order with
//! `direct_get_next_for_subject` needs no consumer, and costs one round trip per chunk.

use std::io;
use std::pin::Pin;

use async_nats::jetstream::object_store::ObjectInfo;
use async_nats::jetstream::{self, stream::Stream};
use base64::engine::general_purpose::URL_SAFE;
use base64::Engine;
use bytes::Bytes;
use futures::stream::{self, BoxStream};
use sha2::{Digest, Sha256};
use tokio_util::io::StreamReader;

/// Why an object could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    #[error("opening the object store {bucket}: {source}")]
    Open {
        bucket: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error("looking up {name}: {source}")]
    Lookup {
        name: String,
        #[source]
        source: async_nats::jetstream::object_store::InfoError,
    },
    /// A chunk could not be fetched, or the bytes do not match the object's size or digest.
    #[error("reading {name}: {source}")]
    Read {
        name: String,
        #[source]
        source: io::Error,
    },
}

/// An `AsyncRead` over an object's bytes; a wrong size or digest is an error at its end.
pub type ObjectReader = StreamReader<BoxStream<'static, io::Result<Bytes>>, Bytes>;

/// The chunks of one object store bucket, readable without consumers.
#[derive(Clone)]
pub struct ObjectChunks {
    stream: Stream,
}

impl ObjectChunks {
    /// Opens the stream behind `bucket` (which must exist).
    pub async fn open(js: &jetstream::Context, bucket: &str) -> Result<Self, ObjectsError> {
        let stream =
            js.get_stream(format!("OBJ_{bucket}"))
                .await
                .map_err(|e| ObjectsError::Open {
                    bucket: bucket.to_string(),
                    source: e.into(),
                })?;
        Ok(Self { stream })
    }

    /// The object's bytes, in order, checked against its size and SHA-256 digest at the end.
    pub fn reader(&self, info: &ObjectInfo) -> ObjectReader {
        struct State {
            stream: Stream,
            subject: String,
            next_seq: u64,
            chunks_left: usize,
            size_left: usize,
            hasher: Sha256,
            digest: Option<String>,
            name: String,
        }
        let state = State {
            stream: self.stream.clone(),
            subject: format!("$O.{}.C.{}", info.bucket, info.nuid),
            next_seq: 1,
            chunks_left: info.chunks,
            size_left: info.size,
            hasher: Sha256::new(),
            digest: info.digest.clone(),
            name: info.name.clone(),
        };
        let chunks = stream::try_unfold(state, |mut s| async move {
            // `try_unfold` ends the stream at the first `None`, so this runs once.
            if s.chunks_left == 0 {
                verify(&s.name, s.size_left, s.hasher.clone(), s.digest.as_deref())?;
                return Ok(None);
            }
            let message = s
                .stream
                .direct_get_next_for_subject(s.subject.clone(), Some(s.next_seq))
                .await
                .map_err(io::Error::other)?;
            s.next_seq = message.sequence + 1;
            s.chunks_left -= 1;
            s.size_left = s
                .size_left
                .checked_sub(message.payload.len())
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: more bytes than its recorded size", s.name),
                    )
                })?;
            s.hasher.update(&message.payload);
            Ok(Some((message.payload, s)))
        });
        let boxed: Pin<Box<dyn futures::Stream<Item = io::Result<Bytes>> + Send>> =
            Box::pin(chunks);
        StreamReader::new(boxed)
    }
}

fn verify(name: &str, size_left: usize, hasher: Sha256, digest: Option<&str>) -> io::Result<()> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {what}"));
    if size_left != 0 {
        return Err(bad("fewer bytes than its recorded size"));
    }
    let Some(expected) = digest.and_then(|d| d.strip_prefix("SHA-256=")) else {
        return Ok(());
    };
    let actual = URL_SAFE.encode(hasher.finalize());
    // Writers differ on base64 padding; the digest is the same either way.
    if actual.trim_end_matches('=') != expected.trim_end_matches('=') {
        return Err(bad("wrong digest"));
    }
    Ok(())
}

/// Reads a whole object of `bucket`; `Ok(None)` when there is no such object.
pub async fn read_all(
    js: &jetstream::Context,
    bucket: &str,
    name: &str,
) -> Result<Option<Vec<u8>>, ObjectsError> {
    use async_nats::jetstream::object_store::InfoErrorKind;
    use tokio::io::AsyncReadExt;
    let store = js
        .get_object_store(bucket)
        .await
        .map_err(|e| ObjectsError::Open {
            bucket: bucket.to_string(),
            source: e.into(),
        })?;
    let info = match store.info(name).await {
        Ok(info) if !info.deleted => info,
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == InfoErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ObjectsError::Lookup {
                name: name.to_string(),
                source,
            })
        }
    };
    let mut out = Vec::with_capacity(info.size.min(1 << 24));
    ObjectChunks::open(js, bucket)
        .await?
        .reader(&info)
        .read_to_end(&mut out)
        .await
        .map_err(|source| ObjectsError::Read {
            name: name.to_string(),
            source,
        })?;
    Ok(Some(out))
}
