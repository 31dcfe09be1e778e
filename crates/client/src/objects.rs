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

/// Where an object's chunks are: (offset of its first byte, stream sequence) per chunk.
#[derive(Debug, Clone)]
pub struct ChunkIndex {
    starts: Vec<(u64, u64)>,
    size: u64,
}

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

    /// Where each chunk of the object starts: built once with a headers-only consumer (the
    /// server sends each chunk's stream sequence and size, not its bytes), so that a range
    /// read afterwards direct-gets exactly the chunks it covers instead of streaming the
    /// object from its start.
    pub async fn index(&self, info: &ObjectInfo) -> Result<ChunkIndex, ObjectsError> {
        use async_nats::jetstream::consumer::{pull, DeliverPolicy};
        use futures::StreamExt;
        let read_err = |source: io::Error| ObjectsError::Read {
            name: info.name.clone(),
            source,
        };
        let mut index = ChunkIndex {
            starts: Vec::with_capacity(info.chunks),
            size: info.size as u64,
        };
        if info.chunks == 0 {
            return Ok(index);
        }
        let consumer = self
            .stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: format!("$O.{}.C.{}", info.bucket, info.nuid),
                deliver_policy: DeliverPolicy::All,
                headers_only: true,
                ..Default::default()
            })
            .await
            .map_err(|e| read_err(io::Error::other(e)))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| read_err(io::Error::other(e)))?;
        let mut offset = 0u64;
        while index.starts.len() < info.chunks {
            let message = messages
                .next()
                .await
                .ok_or_else(|| read_err(io::Error::other("the chunk listing ended early")))?
                .map_err(|e| read_err(io::Error::other(e)))?;
            let meta = message.info().map_err(|e| read_err(io::Error::other(e)))?;
            let size: u64 = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Size"))
                .and_then(|v| v.as_str().parse().ok())
                .ok_or_else(|| read_err(io::Error::other("a chunk without Nats-Msg-Size")))?;
            index.starts.push((offset, meta.stream_sequence));
            offset += size;
        }
        if offset != index.size {
            return Err(read_err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("chunks hold {offset} bytes, the object {}", index.size),
            )));
        }
        Ok(index)
    }

    /// `length` bytes from `offset` (clamped to the object's end), one direct get per chunk
    /// the range covers.
    pub async fn read_range(
        &self,
        index: &ChunkIndex,
        offset: u64,
        length: u64,
    ) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(length).min(index.size);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        // The chunk holding `offset`: the last one starting at or before it.
        let first = index.starts.partition_point(|(start, _)| *start <= offset);
        for &(start, sequence) in index.starts.iter().skip(first.saturating_sub(1)) {
            if start >= end {
                break;
            }
            let chunk = self
                .stream
                .direct_get(sequence)
                .await
                .map_err(io::Error::other)?
                .payload;
            let from = offset.saturating_sub(start) as usize;
            let to = ((end - start) as usize).min(chunk.len());
            if from > to {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a chunk is shorter than indexed",
                ));
            }
            out.extend_from_slice(&chunk[from..to]);
        }
        Ok(out)
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
