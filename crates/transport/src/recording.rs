//! [`RecordingBackend`]: writes every request body it forwards to a directory.
//!
//! For users chasing a cache break (`diff` two recorded bodies and the first differing byte
//! is the culprit) and for tests. Files are named `<seq>-<label>.json`, with `seq` counting
//! from 1 (four digits) and `label` the request's label reduced to `[A-Za-z0-9_-]` (default
//! `request`). Each file is created exclusively: an existing file — or a symlink planted at
//! that path — is never followed or overwritten; the write fails instead.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;

use crate::backend::{Backend, EventStream};
use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::request::{Request, Response};

/// Records each request body (as `codec` encodes it) before forwarding the request.
pub struct RecordingBackend<B> {
    inner: B,
    dir: PathBuf,
    codec: Box<dyn Codec>,
    seq: AtomicU64,
}

impl<B: Backend> RecordingBackend<B> {
    /// Records into `dir`, which must exist and be a directory.
    pub fn new(inner: B, dir: impl Into<PathBuf>, codec: Box<dyn Codec>) -> Result<Self> {
        let dir = dir.into();
        let meta = std::fs::metadata(&dir).map_err(|source| Error::Record {
            path: dir.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(Error::Record {
                path: dir,
                source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        Ok(Self {
            inner,
            dir,
            codec,
            seq: AtomicU64::new(0),
        })
    }

    /// The directory recorded into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    async fn record(&self, request: &Request, stream: bool) -> Result<()> {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let label: String = request
            .label
            .as_deref()
            .unwrap_or("request")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let path = self.dir.join(format!("{seq:04}-{label}.json"));
        let body = self.codec.encode(request, stream);
        let fail = |source| Error::Record {
            path: path.clone(),
            source,
        };
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(fail)?;
        for chunk in body.chunks() {
            file.write_all(chunk).await.map_err(fail)?;
        }
        file.flush().await.map_err(fail)
    }
}

impl<B> fmt::Debug for RecordingBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingBackend")
            .field("dir", &self.dir)
            .field("wire", &self.codec.wire())
            .finish()
    }
}

#[async_trait]
impl<B: Backend> Backend for RecordingBackend<B> {
    async fn send(&self, request: &Request) -> Result<Response> {
        self.record(request, false).await?;
        self.inner.send(request).await
    }

    async fn stream(&self, request: &Request) -> Result<EventStream> {
        self.record(request, true).await?;
        self.inner.stream(request).await
    }
}
