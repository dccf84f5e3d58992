//! walfold's own logical replication client: one CopyBoth session on the replication
//! protocol, built on `postgres-protocol` (framing, SCRAM) and the rustls settings every
//! other walfold connection uses.
//!
//! Why our own: the crate we used before asks for `proto_version '1'` only, so a large
//! transaction reached us after its commit and the source server spilled it to its
//! disk meanwhile. This client speaks pgoutput 1 and 2 (`streaming 'on'`).
//!
//! ```text
//!  socket ──frames──► worker task ──decoded events (bounded)──► reader
//!                       ▲    │
//!   applied LSN ────────┘    └──► standby status update every status_interval,
//!   (update_applied_lsn)          at once when the server asks, and while the
//!                                 reader pushes back (the channel is full)
//! ```
//!
//! The worker decodes each XLogData once ([`change`]); the reader reads the decoded
//! messages. The worker alone owns the socket. When the reader is slow the worker stops reading
//! (TCP pushes back to the server) but keeps sending status updates, so the server's
//! `wal_sender_timeout` never ends a session that is merely busy.

mod change;
mod identify;
mod session;
mod stream;

pub use change::Change;

pub use identify::{probe, Identity};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use walfold_event::Lsn;
use walfold_pg::SslMode;

use crate::budget::{Budget, InFlightBytes};

/// An event from the worker with the bytes it took from the budget.
type Delivered = Result<(ReplicationEvent, InFlightBytes), WireError>;

/// How to open and start one replication session.
#[derive(Clone)]
pub struct WireConfig {
    /// Host names, addresses or Unix socket directories (starting with `/`), each with
    /// its port: the session goes to the first that answers and, when there are several
    /// (or `read_write`), is not a standby.
    pub hosts: Vec<(String, u16)>,
    /// `target_session_attrs=read-write`: a lone host must be the primary too.
    pub read_write: bool,
    /// The system identifier and timeline the server must have (checked before the
    /// slot was prepared): another means a failover happened meanwhile.
    pub expect: Option<(String, u32)>,
    pub user: String,
    pub password: Option<String>,
    pub database: String,
    pub ssl_mode: SslMode,
    pub root_cert: Option<String>,
    pub slot: String,
    /// The publication as pgoutput's `publication_names` expects it (quoted).
    pub publication: String,
    /// pgoutput `proto_version`: 1, or 2 with `streaming 'on'`; `None`: 2 where the
    /// server is 14 or later.
    pub protocol: Option<u8>,
    /// Statements run once the session is open (`set name = value; ...`): settings are
    /// not sent as the `options` startup parameter, which poolers refuse.
    pub settings: Option<String>,
    pub application_name: String,
    /// Longest time between two standby status updates.
    pub status_interval: Duration,
    /// Longest wait for any message from the server while reading. A third of it
    /// without one, status updates ask the server for a reply; past it the connection
    /// counts as dead (a network that drops every packet sends no reset).
    pub silence: Duration,
    /// Capacity of the channel between the worker and the reader.
    pub buffer: usize,
    /// Stop once a transaction boundary at or after this position has been delivered.
    pub stop_lsn: Option<Lsn>,
    /// Called each time a status update reports a new position.
    pub observer: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Bytes of messages in flight from the worker on (`pipeline.ingest_bytes`); `None`:
    /// bounded in messages only.
    pub budget: Option<Budget>,
    /// Which logical messages are read whole; `None`: every one.
    pub messages: Option<MessageFilter>,
}

/// The logical messages walfold reads whole: those under a message outbox's prefix
/// whose content fits `max_bytes`. Any other large one is passed on without its content
/// and discarded as it arrives, so memory stays bounded whatever its size.
#[derive(Debug, Clone)]
pub struct MessageFilter {
    pub prefixes: Vec<String>,
    pub max_bytes: usize,
}

impl MessageFilter {
    /// Whether a message under `prefix` with `len` bytes of content is read whole.
    pub(crate) fn reads(&self, prefix: &str, len: usize) -> bool {
        len <= self.max_bytes && self.prefixes.iter().any(|p| p == prefix)
    }
}

impl std::fmt::Debug for WireConfig {
    // The password is left out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireConfig")
            .field("hosts", &self.hosts)
            .field("user", &self.user)
            .field("database", &self.database)
            .field("ssl_mode", &self.ssl_mode)
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

impl WireConfig {
    pub fn with_stop_lsn(mut self, lsn: Lsn) -> Self {
        self.stop_lsn = Some(lsn);
        self
    }

    pub fn with_status_interval(mut self, interval: Duration) -> Self {
        self.status_interval = interval;
        self
    }
}

/// What the server sent, in stream order: every XLogData decoded once (see
/// [`change`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationEvent {
    /// A server keepalive; a reply, when asked for, has been sent already.
    KeepAlive {
        wal_end: Lsn,
        reply_requested: bool,
        server_time_micros: i64,
    },
    /// One pgoutput message (`wal_start`: for a change, its WAL record).
    Change {
        wal_start: Lsn,
        change: Change,
        /// The top-level xid of the streamed block (protocol 2) the message is in.
        stream: Option<u32>,
    },
    /// The configured stop position was reached; nothing follows.
    StoppedAt { reached: Lsn },
}

/// Errors of the replication session.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("tls: {0}")]
    Tls(String),
    #[error("authentication: {0}")]
    Auth(String),
    /// The server refused a command of the session (its startup, `IDENTIFY_SYSTEM`,
    /// `START_REPLICATION`: a missing slot is one of these).
    #[error("{message} (SQLSTATE {})", code.as_deref().unwrap_or("?"))]
    Server {
        code: Option<String>,
        message: String,
    },
    /// The server failed the stream after `START_REPLICATION` was accepted, while
    /// decoding WAL: the only object pgoutput then looks up by name is the publication.
    #[error("{message} (SQLSTATE {})", code.as_deref().unwrap_or("?"))]
    Streaming {
        code: Option<String>,
        message: String,
    },
    #[error("protocol: {0}")]
    Protocol(String),
    /// A pgoutput message walfold cannot read.
    #[error("{0}")]
    Decode(walfold_pgoutput::DecodeError),
    #[error("{0}")]
    Unsupported(String),
    /// None of the configured hosts answered as a primary (a failover in progress).
    #[error("no configured host is a primary that accepts writes: {0}")]
    NoPrimary(String),
}

impl WireError {
    /// A server's error read from the running stream rather than as a command's answer.
    pub(crate) fn in_stream(self) -> WireError {
        match self {
            WireError::Server { code, message } => WireError::Streaming { code, message },
            other => other,
        }
    }

    pub(crate) fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> WireError {
        move |source| WireError::Io { context, source }
    }
}

/// The handle the reader holds: events in, applied positions out.
pub struct ReplicationClient {
    events: mpsc::Receiver<Delivered>,
    progress: Arc<Progress>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// `server_version_num` of the source.
    pub server_version: u32,
    /// The pgoutput protocol version in use.
    pub protocol: u8,
    /// The server streaming: its system identifier, timeline, host.
    pub identity: Identity,
}

/// The applied position shared by the reader and the worker.
pub(crate) struct Progress {
    applied: AtomicU64,
    raised: Notify,
}

impl Progress {
    pub(crate) fn applied(&self) -> Lsn {
        Lsn(self.applied.load(Ordering::Acquire))
    }
}

impl ReplicationClient {
    /// Connects, authenticates and starts streaming from the slot's confirmed position.
    pub async fn connect(cfg: WireConfig) -> Result<ReplicationClient, WireError> {
        let (io, server_version, protocol, identity) =
            tokio::time::timeout(Duration::from_secs(30), session::open(&cfg))
                .await
                .map_err(|_| WireError::Io {
                    context: "connecting to the source",
                    source: std::io::ErrorKind::TimedOut.into(),
                })??;
        let (tx, rx) = mpsc::channel(cfg.buffer.max(1));
        let progress = Arc::new(Progress {
            applied: AtomicU64::new(0),
            raised: Notify::new(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let worker = stream::Worker::new(io, cfg, tx, progress.clone(), stop_rx);
        let task = tokio::spawn(worker.run());
        Ok(ReplicationClient {
            events: rx,
            progress,
            stop,
            task,
            server_version,
            protocol,
            identity,
        })
    }

    /// The next event, with the bytes it holds of the budget until they are given back
    /// (dropped); `None` once the session has ended without an error.
    pub async fn recv(&mut self) -> Result<Option<(ReplicationEvent, InFlightBytes)>, WireError> {
        match self.events.recv().await {
            Some(Ok(e)) => Ok(Some(e)),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    /// Everything up to `lsn` is durable: report it as flushed (monotonic).
    pub fn update_applied_lsn(&self, lsn: Lsn) {
        let before = self.progress.applied.fetch_max(lsn.0, Ordering::AcqRel);
        if lsn.0 > before {
            self.progress.raised.notify_one();
        }
    }

    /// Reports the final position, ends the stream and closes the session.
    pub async fn shutdown(self) -> Result<(), WireError> {
        let _ = self.stop.send(true);
        drop(self.events);
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(_) => Ok(()),
            Err(_) => Err(WireError::Protocol(
                "the session did not close in 5 s".into(),
            )),
        }
    }

    /// Drops the session at once.
    pub fn abort(self) {
        self.task.abort();
    }
}
