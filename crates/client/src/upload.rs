//! Content of any size streamed into a workspace by `workspace.upload` chunks, holding at most
//! [`TRANSFER_WINDOW`] chunks (plus the one being filled) in memory whatever the size.
//! [`WorkspaceClient::stage`] hands content to the store without making it a file,
//! [`WorkspaceClient::commit`] makes it one and [`WorkspaceClient::abandon`] drops it;
//! [`WorkspaceClient::write_stream`] does both. A whole buffer (`write`, `restore`) goes the
//! same way, as a stream of one item.

use std::convert::Infallible;
use std::pin::{pin, Pin};

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, Either};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use messages::exec::ContentEncoding;
use messages::subjects::WorkspaceOp;
use messages::workspace::{
    wire_content, UploadRef, WsEntry, WsUploadAck, WsUploadChunk, WsWrite, INLINE_MAX_BYTES,
    TRANSFER_CHUNK_MAX_BYTES,
};
use sha2::{Digest, Sha256};

use crate::error::StreamError;
use crate::workspace::{WorkspaceClient, TRANSFER_WINDOW};
use crate::Result;

/// Content handed to the workspace store but not yet a file: nothing of it is visible in the
/// workspace until [`WorkspaceClient::commit`].
#[derive(Debug, Clone, PartialEq)]
pub enum Staged {
    /// Small enough for one message: kept here and sent with the write.
    Inline(Bytes),
    /// Chunks the store holds (they expire unless committed, and count against the session's
    /// open uploads until then).
    Upload(UploadRef),
}

/// A digest no content has: a commit claiming it makes the store drop the upload's chunks
/// (its answer to a wrong digest) and refuse the write, touching no file.
const NO_CONTENT_DIGEST: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Any valid path: an abandoning commit is refused before the path is used.
const ABANDON_PATH: &str = "abandoned-upload";

impl WorkspaceClient {
    /// Hands `content` to the store: inline when it fits one message, else as upload chunks
    /// sent while the stream is read, a few in flight. Content that fails part-way leaves
    /// nothing behind (its chunks are dropped).
    pub async fn stage<S, E>(&self, session: &str, content: S) -> Result<Staged, StreamError<E>>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send,
        E: Send,
    {
        let mut content = pin!(content);
        // What one message holds decides: the first item alone when it is that large (a whole
        // buffer is then never copied), else the items up to it.
        let mut head: Vec<Bytes> = Vec::new();
        let mut held = 0u64;
        while held <= INLINE_MAX_BYTES {
            match content.next().await {
                None => {
                    let whole = match head.len() {
                        1 => head.pop().expect("one"),
                        _ => head.concat().into(),
                    };
                    return Ok(Staged::Inline(whole));
                }
                Some(Ok(bytes)) => {
                    held += bytes.len() as u64;
                    head.push(bytes);
                }
                Some(Err(e)) => return Err(StreamError::Content(e)),
            }
        }
        let rest = futures::stream::iter(head.into_iter().map(Ok)).chain(content);
        Ok(Staged::Upload(self.upload_stream(session, rest).await?))
    }

    /// Makes staged content the file at `path` (replacing it). A refused commit drops the
    /// staged chunks.
    pub async fn commit(&self, session: &str, path: &str, staged: Staged) -> Result<WsEntry> {
        let mut req = WsWrite {
            session_id: session.into(),
            path: path.into(),
            content: String::new(),
            encoding: ContentEncoding::Utf8,
            append: false,
            requested_by: self.requested_by.clone(),
            object: None,
            upload: None,
        };
        match staged {
            Staged::Inline(data) => {
                (req.content, req.encoding) = wire_content(&data);
                self.call(WorkspaceOp::Write, &req, false).await
            }
            Staged::Upload(upload) => {
                let id = upload.upload_id.clone();
                req.upload = Some(upload);
                let written = self.call(WorkspaceOp::Write, &req, true).await;
                if written.is_err() {
                    // Refused before the store took the chunks (a bad path): drop them.
                    self.abandon_upload(session, &id).await;
                }
                written
            }
        }
    }

    /// Drops staged content that will not be committed (best effort: chunks also expire).
    pub async fn abandon(&self, session: &str, staged: Staged) {
        if let Staged::Upload(upload) = staged {
            self.abandon_upload(session, &upload.upload_id).await;
        }
    }

    /// Writes a file of any size from a stream, holding a bounded part of it at a time:
    /// [`stage`](Self::stage), then [`commit`](Self::commit).
    pub async fn write_stream<S, E>(
        &self,
        session: &str,
        path: &str,
        content: S,
    ) -> Result<WsEntry, StreamError<E>>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send,
        E: Send,
    {
        let staged = self.stage(session, content).await?;
        Ok(self.commit(session, path, staged).await?)
    }

    /// `data` as upload chunks (for `write` and `restore` of a buffer).
    pub(crate) async fn upload_chunks(&self, session: &str, data: &[u8]) -> Result<UploadRef> {
        let one = futures::stream::iter([Ok::<_, Infallible>(Bytes::copy_from_slice(data))]);
        self.upload_stream(session, one)
            .await
            .map_err(StreamError::into_mesh)
    }

    /// Sends `content` as `upload` chunks of [`TRANSFER_CHUNK_MAX_BYTES`] (chunk 0 first: it
    /// opens the upload), at most [`TRANSFER_WINDOW`] in flight while the next is read, and
    /// returns what a write or restore names to commit it. On failure the upload is dropped.
    async fn upload_stream<S, E>(
        &self,
        session: &str,
        content: S,
    ) -> Result<UploadRef, StreamError<E>>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send,
        E: Send,
    {
        // Fused: the last, short chunk is cut when the end is seen, and the next read asks again.
        let mut content = pin!(content.fuse());
        let mut carry = Bytes::new();
        let upload_id = messages::new_id();
        let mut digest = Sha256::new();
        let first = match next_chunk(content.as_mut(), &mut carry).await {
            None => Bytes::new(),
            Some(read) => read.map_err(StreamError::Content)?,
        };
        digest.update(&first);
        self.send_chunk(session, &upload_id, 0, first).await?;
        let mut chunks = 1u64;
        let mut in_flight = FuturesUnordered::new();
        let sent: Result<(), StreamError<E>> = async {
            loop {
                while in_flight.len() >= TRANSFER_WINDOW {
                    in_flight.next().await.expect("not empty")?;
                }
                // Acks keep arriving while the next chunk is read; the read itself is never
                // dropped half-done.
                let mut read = pin!(next_chunk(content.as_mut(), &mut carry));
                let chunk = loop {
                    if in_flight.is_empty() {
                        break read.await;
                    }
                    match futures::future::select(in_flight.next(), read.as_mut()).await {
                        Either::Left((ack, _)) => {
                            ack.expect("not empty")?;
                        }
                        Either::Right((chunk, _)) => break chunk,
                    }
                };
                match chunk {
                    None => break,
                    Some(Err(e)) => return Err(StreamError::Content(e)),
                    Some(Ok(part)) => {
                        digest.update(&part);
                        in_flight.push(self.send_chunk(session, &upload_id, chunks, part));
                        chunks += 1;
                    }
                }
            }
            while let Some(ack) = in_flight.next().await {
                ack?;
            }
            Ok(())
        }
        .await;
        if let Err(e) = sent {
            // No chunk may land after the upload is dropped.
            while in_flight.next().await.is_some() {}
            self.abandon_upload(session, &upload_id).await;
            return Err(e);
        }
        Ok(UploadRef {
            upload_id,
            chunks,
            sha256: hex::encode(digest.finalize()),
        })
    }

    /// One chunk's request, boxed: an unboxed future held across the loop's awaits makes the
    /// upload not provably `Send` to callers that spawn it.
    fn send_chunk(
        &self,
        session: &str,
        upload_id: &str,
        seq: u64,
        part: Bytes,
    ) -> BoxFuture<'_, Result<WsUploadAck>> {
        let req = WsUploadChunk {
            session_id: session.into(),
            upload_id: upload_id.into(),
            seq,
            data: part.to_vec(),
        };
        async move { self.call(WorkspaceOp::Upload, &req, true).await }.boxed()
    }

    /// Ends an upload that will not be committed, so its chunks stop counting against the
    /// session's open uploads at once (they would expire anyway).
    async fn abandon_upload(&self, session: &str, upload_id: &str) {
        let req = WsWrite {
            session_id: session.into(),
            path: ABANDON_PATH.into(),
            content: String::new(),
            encoding: ContentEncoding::Utf8,
            append: false,
            requested_by: None,
            object: None,
            upload: Some(UploadRef {
                upload_id: upload_id.into(),
                chunks: 1,
                sha256: NO_CONTENT_DIGEST.into(),
            }),
        };
        // Refused by design; any other answer means there was nothing left to drop.
        let _ = self
            .call::<_, WsEntry>(WorkspaceOp::Write, &req, true)
            .await;
    }
}

/// The next [`TRANSFER_CHUNK_MAX_BYTES`] of `content` (fewer only at its end), taking from
/// `carry` first and leaving there what the last item had beyond the chunk. `None` at the end.
async fn next_chunk<S, E>(
    mut content: Pin<&mut S>,
    carry: &mut Bytes,
) -> Option<std::result::Result<Bytes, E>>
where
    S: Stream<Item = std::result::Result<Bytes, E>>,
{
    let size = TRANSFER_CHUNK_MAX_BYTES as usize;
    if carry.len() >= size {
        return Some(Ok(carry.split_to(size)));
    }
    let mut chunk = BytesMut::with_capacity(size);
    chunk.extend_from_slice(&std::mem::take(carry));
    loop {
        match content.next().await {
            None => return (!chunk.is_empty()).then(|| Ok(chunk.freeze())),
            Some(Err(e)) => return Some(Err(e)),
            Some(Ok(mut bytes)) => {
                let wanted = size - chunk.len();
                if bytes.len() >= wanted {
                    chunk.extend_from_slice(&bytes.split_to(wanted));
                    *carry = bytes;
                    return Some(Ok(chunk.freeze()));
                }
                chunk.extend_from_slice(&bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chunks_are_full_whatever_the_items() {
        let size = TRANSFER_CHUNK_MAX_BYTES as usize;
        let items: Vec<Result<Bytes, Infallible>> = [1usize, size - 1, 3, 2 * size + 5, 0, 7]
            .iter()
            .enumerate()
            .map(|(i, n)| Ok(Bytes::from(vec![i as u8; *n])))
            .collect();
        let total: usize = [1, size - 1, 3, 2 * size + 5, 0, 7].iter().sum();
        let mut content = pin!(futures::stream::iter(items));
        let mut carry = Bytes::new();
        let mut sizes = Vec::new();
        while let Some(chunk) = next_chunk(content.as_mut(), &mut carry).await {
            sizes.push(chunk.unwrap().len());
        }
        assert_eq!(sizes.iter().sum::<usize>(), total);
        let (last, full) = sizes.split_last().unwrap();
        assert!(full.iter().all(|s| *s == size), "{sizes:?}");
        assert_eq!(*last, total % size);
    }
}
