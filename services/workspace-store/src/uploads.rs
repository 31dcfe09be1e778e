//! `Uploads`: large content moved in by request/reply only (`workspace.upload`), so that a
//! tenant's agent — which has no JetStream API in the services' account — writes files of any
//! size. Chunks wait in the stream `<STEM>_WORKSPACE_UPLOADS`, one subject per chunk
//! (`…workspace-uploads.<session>.<upload>.<seq>`, last message per subject kept, so a resent
//! chunk replaces itself), where every instance can read them; `max_age` removes abandoned
//! uploads. A write or restore naming the upload streams its chunks, in order, into an
//! `upload/<id>` object of the blobs bucket and then takes the same path as a handed-over
//! object. The session in the subject is already scoped by the caller's tenant, so another
//! tenant's chunk subjects are never reached.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::StreamExt;
use messages::subjects::Subjects;
use messages::workspace::{
    upload_name, UploadRef, WsUploadAck, WsUploadChunk, MAX_UPLOADS_PER_SESSION,
    TRANSFER_CHUNK_MAX_BYTES,
};
use sha2::{Digest, Sha256};
use tokio_util::io::StreamReader;

use crate::blobs::Blobs;
use crate::error::{Result, StoreError};
use crate::keys;

pub struct Uploads {
    js: jetstream::Context,
    stream: stream::Stream,
    subjects: Subjects,
}

impl Uploads {
    /// Opens (creating if missing) the uploads stream; `ttl` bounds how long an upload that is
    /// never committed keeps its chunks. What open uploads hold is bounded per session
    /// ([`MAX_UPLOADS_PER_SESSION`], each at most the quota at commit) and by the account's
    /// JetStream storage; a stream `max_bytes` would reserve that storage up front.
    pub async fn open(
        js: &jetstream::Context,
        subjects: &Subjects,
        ttl: Duration,
        replicas: usize,
    ) -> Result<Self> {
        let stream = js
            .get_or_create_stream(stream::Config {
                name: subjects.workspace_uploads_stream(),
                description: Some("sandmesh workspace uploads not yet committed".into()),
                subjects: vec![subjects.workspace_uploads(">")],
                max_messages_per_subject: 1,
                // Chunks are read by direct gets, without consumers.
                allow_direct: true,
                max_age: ttl,
                storage: stream::StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| StoreError::storage("opening the uploads stream", e))?;
        Ok(Self {
            js: js.clone(),
            stream,
            subjects: subjects.clone(),
        })
    }

    /// Stores one chunk. `seq` 0 opens the upload (refused past
    /// [`MAX_UPLOADS_PER_SESSION`]); any other chunk needs its upload open.
    pub async fn append(&self, req: WsUploadChunk) -> Result<WsUploadAck> {
        let session = &req.session_id;
        keys::check_session(session)?;
        messages::validate::validate_id("upload_id", &req.upload_id)?;
        if req.data.len() as u64 > TRANSFER_CHUNK_MAX_BYTES {
            return Err(StoreError::TooLarge(format!(
                "an upload chunk carries at most {TRANSFER_CHUNK_MAX_BYTES} bytes, this one {}",
                req.data.len()
            )));
        }
        let open = self.open_uploads(session).await?;
        let this_open = open.iter().any(|u| u == &req.upload_id);
        if req.seq == 0 && !this_open && open.len() >= MAX_UPLOADS_PER_SESSION {
            return Err(StoreError::Conflict(format!(
                "workspace {session} has {MAX_UPLOADS_PER_SESSION} uploads open; commit or \
                 abandon one first"
            )));
        }
        if req.seq > 0 && !this_open {
            return Err(StoreError::NotFound(format!(
                "no upload {} in workspace {session} (send seq 0 first; uploads expire)",
                req.upload_id
            )));
        }
        let subject = self
            .subjects
            .workspace_upload_chunk(session, &req.upload_id, req.seq);
        self.js
            .publish(subject, Bytes::from(req.data))
            .await
            .map_err(|e| StoreError::storage("storing a chunk", e))?
            .await
            .map_err(|e| StoreError::storage("storing a chunk", e))?;
        Ok(WsUploadAck {
            upload_id: req.upload_id,
            seq: req.seq,
        })
    }

    /// The ids of the session's open uploads (those whose chunk 0 is stored).
    async fn open_uploads(&self, session: &str) -> Result<Vec<String>> {
        use futures::TryStreamExt;
        let filter = self.subjects.workspace_uploads(&format!("{session}.*.0"));
        let stream = self.stream.clone();
        let subjects: Vec<(String, usize)> = stream
            .info_with_subjects(filter)
            .await
            .map_err(|e| StoreError::storage("listing open uploads", e))?
            .try_collect()
            .await
            .map_err(|e| StoreError::storage("listing open uploads", e))?;
        Ok(subjects
            .into_iter()
            .filter_map(|(subject, _)| subject.rsplit('.').nth(1).map(str::to_string))
            .collect())
    }

    /// Streams the upload's chunks, in order, into a fresh `upload/<id>` object, checks its
    /// digest and size (at most `max_bytes`), and removes the chunks. Returns the object and
    /// its size and SHA-256 (hex). A missing chunk is a conflict and leaves the upload as it
    /// is, so the client can send it and commit again; a wrong digest or size ends the upload.
    pub async fn commit(
        &self,
        blobs: &Blobs,
        session: &str,
        upload: &UploadRef,
        max_bytes: u64,
    ) -> Result<(String, u64, String)> {
        keys::check_session(session)?;
        messages::validate::validate_id("upload_id", &upload.upload_id)?;
        let expected = upload.sha256.to_ascii_lowercase();
        if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(StoreError::BadRequest(
                "upload.sha256 must be 64 hex digits".into(),
            ));
        }
        if upload.chunks == 0 {
            return Err(StoreError::BadRequest(
                "upload.chunks must be at least 1".into(),
            ));
        }
        // Every chunk must be there before anything is written.
        let mut sequences = Vec::with_capacity(upload.chunks as usize);
        for seq in 0..upload.chunks {
            let subject = self
                .subjects
                .workspace_upload_chunk(session, &upload.upload_id, seq);
            match self.stream.direct_get_last_for_subject(subject).await {
                Ok(m) => sequences.push(m.sequence),
                Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => {
                    return Err(if seq == 0 {
                        StoreError::NotFound(format!(
                            "no upload {} in workspace {session} (uploads expire)",
                            upload.upload_id
                        ))
                    } else {
                        StoreError::Conflict(format!(
                            "chunk {seq} of upload {} never arrived; send it and commit again",
                            upload.upload_id
                        ))
                    });
                }
                Err(e) => return Err(StoreError::storage("looking up a chunk", e)),
            }
        }
        let name = upload_name();
        // What went through, shared with the reader the object store consumes.
        let seen = Arc::new(Mutex::new((Sha256::new(), 0u64)));
        let chunks = futures::stream::iter(sequences).then({
            let (stream, seen) = (self.stream.clone(), seen.clone());
            move |sequence| {
                let (stream, seen) = (stream.clone(), seen.clone());
                async move {
                    let payload = stream
                        .direct_get(sequence)
                        .await
                        .map_err(io::Error::other)?
                        .payload;
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    seen.1 += payload.len() as u64;
                    if seen.1 > max_bytes {
                        return Err(io::Error::new(io::ErrorKind::FileTooLarge, "too large"));
                    }
                    seen.0.update(&payload);
                    Ok::<_, io::Error>(payload)
                }
            }
        });
        let mut reader = StreamReader::new(Box::pin(chunks));
        let outcome = blobs.put(&name, &mut reader).await;
        self.forget(session, &upload.upload_id).await?;
        let (digest, size) = std::mem::take(&mut *seen.lock().unwrap_or_else(|p| p.into_inner()));
        if let Err(e) = outcome {
            blobs.remove(&name).await?;
            return Err(if size > max_bytes {
                StoreError::TooLarge(format!(
                    "upload {} is larger than {max_bytes} bytes",
                    upload.upload_id
                ))
            } else {
                e
            });
        }
        let actual = hex::encode(digest.finalize());
        if actual != expected {
            blobs.remove(&name).await?;
            return Err(StoreError::BadRequest(format!(
                "upload {} has SHA-256 {actual}, not {expected} as claimed",
                upload.upload_id
            )));
        }
        Ok((name, size, actual))
    }

    /// Removes every chunk of an upload.
    async fn forget(&self, session: &str, upload: &str) -> Result<()> {
        self.stream
            .purge()
            .filter(
                self.subjects
                    .workspace_uploads(&format!("{session}.{upload}.>")),
            )
            .await
            .map_err(|e| StoreError::storage("removing an upload's chunks", e))?;
        Ok(())
    }
}
