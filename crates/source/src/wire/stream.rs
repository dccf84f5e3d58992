//! The CopyBoth loop: XLogData and keepalives in, standby status updates out.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use postgres_protocol::message::frontend;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use walfold_pgoutput::{decode, Message};
use walfold_store::Lsn;

use super::session::{parse, server_error, Conn, Frame};
use super::{Progress, ReplicationEvent, WireConfig, WireError};

type Out = mpsc::Sender<Result<ReplicationEvent, WireError>>;

pub(crate) struct Worker {
    conn: Conn,
    cfg: WireConfig,
    out: Out,
    progress: Arc<Progress>,
    stop: watch::Receiver<bool>,
    /// The position the last status update reported.
    reported: Lsn,
    last_status: Instant,
    /// Between Stream Start and Stream Stop (protocol 2): messages carry an xid.
    in_stream: bool,
}

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Why the loop ended without an error.
enum End {
    Stopped,
    Reached,
}

impl Worker {
    pub(crate) fn new(
        conn: Conn,
        cfg: WireConfig,
        out: Out,
        progress: Arc<Progress>,
        stop: watch::Receiver<bool>,
    ) -> Worker {
        let last_status = Instant::now() - cfg.status_interval;
        Worker {
            conn,
            cfg,
            out,
            progress,
            stop,
            reported: Lsn::ZERO,
            last_status,
            in_stream: false,
        }
    }

    pub(crate) async fn run(mut self) {
        let result = self.stream().await;
        match result {
            Ok(_) => {
                // A clean end: the final position, CopyDone, Terminate.
                let _ = self.status(false).await;
                let mut out = BytesMut::new();
                frontend::copy_done(&mut out);
                frontend::terminate(&mut out);
                let _ = self.conn.send(&out).await;
            }
            Err(e) => {
                let _ = self.out.send(Err(e)).await;
            }
        }
    }

    async fn stream(&mut self) -> Result<End, WireError> {
        loop {
            while let Some(frame) = self.conn.try_frame()? {
                if let Some(end) = self.frame(frame).await? {
                    return Ok(end);
                }
            }
            let due = self.last_status + self.cfg.status_interval;
            let progress = self.progress.clone();
            tokio::select! {
                biased;
                _ = self.stop.changed() => return Ok(End::Stopped),
                _ = progress.raised.notified() => {
                    if self.progress.applied() > self.reported {
                        self.status(false).await?;
                    }
                }
                _ = tokio::time::sleep_until(due) => self.status(false).await?,
                r = self.conn.fill() => r?,
            }
        }
    }

    /// Handles one message; `Some` when the stream is over.
    async fn frame(&mut self, frame: Frame) -> Result<Option<End>, WireError> {
        match frame.tag {
            b'd' => self.copy_data(frame.body.freeze()).await,
            b'c' => Err(WireError::Protocol("the server ended the stream".into())),
            _ => match parse(frame)? {
                Message2::ErrorResponse(body) => Err(server_error(body.fields())),
                Message2::NoticeResponse(_) | Message2::ParameterStatus(_) => Ok(None),
                Message2::CommandComplete(_) | Message2::ReadyForQuery(_) => {
                    Err(WireError::Protocol("the server ended the stream".into()))
                }
                _ => Err(WireError::Protocol(
                    "unexpected message in the stream".into(),
                )),
            },
        }
    }

    async fn copy_data(&mut self, mut data: Bytes) -> Result<Option<End>, WireError> {
        let short = || WireError::Protocol("short replication message".into());
        if data.is_empty() {
            return Err(short());
        }
        match data.get_u8() {
            b'w' => {
                if data.len() < 24 {
                    return Err(short());
                }
                let wal_start = Lsn(data.get_u64());
                let wal_end = Lsn(data.get_u64());
                let server_time_micros = data.get_i64();
                self.xlog(wal_start, wal_end, server_time_micros, data)
                    .await
            }
            b'k' => {
                if data.len() < 17 {
                    return Err(short());
                }
                let wal_end = Lsn(data.get_u64());
                let server_time_micros = data.get_i64();
                let reply_requested = data.get_u8() == 1;
                if reply_requested {
                    self.status(false).await?;
                }
                // A keepalive only moves the position: when the reader is behind, the
                // next one does the same, so it is dropped rather than waited for.
                if let Err(mpsc::error::TrySendError::Closed(_)) =
                    self.out.try_send(Ok(ReplicationEvent::KeepAlive {
                        wal_end,
                        reply_requested,
                        server_time_micros,
                    }))
                {
                    return Ok(Some(End::Stopped));
                }
                Ok(None)
            }
            other => Err(WireError::Protocol(format!(
                "unknown replication message {:?}",
                other as char
            ))),
        }
    }

    async fn xlog(
        &mut self,
        wal_start: Lsn,
        wal_end: Lsn,
        server_time_micros: i64,
        data: Bytes,
    ) -> Result<Option<End>, WireError> {
        let mut boundary = None;
        let event = match decode(&data, self.in_stream) {
            Ok(Message::Begin(b)) => {
                boundary = Some(Lsn(b.final_lsn));
                ReplicationEvent::Begin {
                    final_lsn: Lsn(b.final_lsn),
                    xid: b.xid,
                    commit_time_micros: b.commit_time,
                }
            }
            Ok(Message::Commit(c)) => {
                boundary = Some(Lsn(c.end_lsn));
                ReplicationEvent::Commit {
                    lsn: Lsn(c.commit_lsn),
                    end_lsn: Lsn(c.end_lsn),
                    commit_time_micros: c.commit_time,
                }
            }
            Ok(Message::LogicalMessage(m)) => ReplicationEvent::Message {
                transactional: m.transactional,
                lsn: Lsn(m.lsn),
                prefix: m.prefix.to_owned(),
                content: data.slice_ref(m.content),
                xid: m.xid,
            },
            other => {
                match other {
                    Ok(Message::StreamStart(_)) => self.in_stream = true,
                    Ok(Message::StreamStop) => self.in_stream = false,
                    Ok(Message::StreamCommit(c)) => boundary = Some(Lsn(c.end_lsn)),
                    // The reader decodes again and reports what it cannot read.
                    _ => {}
                }
                ReplicationEvent::XLogData {
                    wal_start,
                    wal_end,
                    server_time_micros,
                    data,
                }
            }
        };
        if !self.forward(event).await? {
            return Ok(Some(End::Stopped));
        }
        if let (Some(stop), Some(reached)) = (self.cfg.stop_lsn, boundary) {
            if reached >= stop {
                self.forward(ReplicationEvent::StoppedAt { reached })
                    .await?;
                return Ok(Some(End::Reached));
            }
        }
        Ok(None)
    }

    /// Hands an event to the reader. While the reader pushes back, status updates go on
    /// every `status_interval`, so the server keeps seeing a live client; the socket is
    /// not read meanwhile (TCP pushes back to the server). `false`: stop.
    async fn forward(&mut self, event: ReplicationEvent) -> Result<bool, WireError> {
        match self.out.try_reserve() {
            Ok(permit) => {
                permit.send(Ok(event));
                return Ok(true);
            }
            Err(mpsc::error::TrySendError::Closed(())) => return Ok(false),
            Err(mpsc::error::TrySendError::Full(())) => {}
        }
        let out = self.out.clone();
        let mut reserve = std::pin::pin!(out.reserve_owned());
        loop {
            let due = self.last_status + self.cfg.status_interval;
            tokio::select! {
                biased;
                _ = self.stop.changed() => return Ok(false),
                p = &mut reserve => match p {
                    Ok(p) => {
                        p.send(Ok(event));
                        return Ok(true);
                    }
                    Err(_) => return Ok(false),
                },
                _ = tokio::time::sleep_until(due) => self.status(false).await?,
            }
        }
    }

    /// Sends a standby status update reporting the applied position as written,
    /// flushed and applied.
    async fn status(&mut self, reply: bool) -> Result<(), WireError> {
        let applied = self.progress.applied();
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(applied.0);
        body.put_u64(applied.0);
        body.put_u64(applied.0);
        body.put_i64(now_pg_micros());
        body.put_u8(u8::from(reply));
        let mut out = BytesMut::new();
        frontend::CopyData::new(&body[..])
            .map_err(WireError::io("encoding a status update"))?
            .write(&mut out);
        self.conn.send(&out).await?;
        self.last_status = Instant::now();
        if applied > self.reported {
            self.reported = applied;
            if let Some(observe) = &self.cfg.observer {
                observe();
            }
        }
        Ok(())
    }
}

use postgres_protocol::message::backend::Message as Message2;

fn now_pg_micros() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_micros() as i64;
    unix - PG_EPOCH_MICROS
}
