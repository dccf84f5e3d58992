//! The CopyBoth loop: XLogData and keepalives in, standby status updates out.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use postgres_protocol::message::backend::Message as Backend;
use postgres_protocol::message::frontend;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use walfold_event::Lsn;
use walfold_pgoutput::decode_message_head;

use super::change::{Change, Decoder};
use super::session::{parse, server_error, Conn, Frame};
use super::{Delivered, Progress, ReplicationEvent, WireConfig, WireError};
use crate::budget::InFlightBytes;

type Out = mpsc::Sender<Delivered>;

pub(crate) struct Worker {
    conn: Conn,
    cfg: WireConfig,
    out: Out,
    progress: Arc<Progress>,
    stop: watch::Receiver<bool>,
    /// The position the last status update reported.
    reported: Lsn,
    last_status: Instant,
    /// When the server was last heard from (or reading resumed after back-pressure).
    last_heard: Instant,
    /// Decodes each XLogData once, knowing whether it is inside a streamed block.
    decoder: Decoder,
    /// The budget taken for a large message before reading it (see [`Worker::stream`]).
    reserved: Option<InFlightBytes>,
}

/// A message larger than this is read only once the budget has room for it: otherwise
/// one such message would wait in the read buffer beside the budget's worth in flight.
const READ_AFTER_TAKING: usize = 64 * 1024;

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Why the loop ended without an error: asked to stop, or the stop position reached.
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
            last_heard: Instant::now(),
            decoder: Decoder::default(),
            reserved: None,
        }
    }

    pub(crate) async fn run(mut self) {
        let result = self.stream().await;
        match result {
            Ok(_) => {
                // A clean end: the final position, CopyDone, Terminate.
                let _ = self.status().await;
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
            let mut heard = false;
            while let Some(frame) = self.conn.try_frame()? {
                heard = true;
                if let Some(end) = self.frame(frame).await? {
                    return Ok(end);
                }
            }
            if heard {
                self.last_heard = Instant::now();
            }
            if let Some((event, len)) = self.unread_message() {
                // Its budget, if taken while its head arrived, is not needed.
                self.reserved = None;
                self.conn.discard(len);
                if !self.forward(event, 0).await? {
                    return Ok(End::Stopped);
                }
                continue;
            }
            let due = self.last_status + self.cfg.status_interval;
            let dead = self.last_heard + self.cfg.silence;
            let progress = self.progress.clone();
            // A large message is read once the budget has room for it (the server waits
            // meanwhile, as when the reader pushes back).
            let wait_for = match (&self.cfg.budget, self.conn.incomplete()) {
                (Some(budget), Some(len)) if len > READ_AFTER_TAKING && self.reserved.is_none() => {
                    Some(budget.clone().take(len))
                }
                _ => None,
            };
            let waiting = wait_for.is_some();
            let take = async move {
                match wait_for {
                    Some(take) => take.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = self.stop.changed() => return Ok(End::Stopped),
                _ = progress.raised.notified() => {
                    if self.progress.applied() > self.reported {
                        self.status().await?;
                    }
                }
                _ = tokio::time::sleep_until(due) => self.status().await?,
                held = take => {
                    self.reserved = Some(held);
                    self.last_heard = Instant::now();
                }
                r = self.conn.fill(), if !waiting => r?,
                _ = tokio::time::sleep_until(dead), if !waiting => {
                    return Err(WireError::io("reading the replication stream")(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "no message from the source server for {} s, though asked for one",
                            self.cfg.silence.as_secs()
                        ),
                    )));
                }
            }
        }
    }

    /// A large logical message walfold does not read whole (a prefix it ignores, content
    /// over `max_event_bytes`), known from the first bytes of its frame: the message
    /// without its content, and the frame's length, to be discarded as it arrives rather
    /// than read into memory. `None` for anything else, or until its head is in.
    fn unread_message(&self) -> Option<(ReplicationEvent, usize)> {
        let filter = self.cfg.messages.as_ref()?;
        let len = self.conn.incomplete()?;
        // CopyData ('d', length), XLogData ('w', WAL start, WAL end, clock), then the
        // pgoutput payload.
        const PAYLOAD_AT: usize = 1 + 4 + 1 + 8 + 8 + 8;
        let buf = &self.conn.buf;
        if len <= READ_AFTER_TAKING || buf.len() <= PAYLOAD_AT || buf[0] != b'd' || buf[5] != b'w' {
            return None;
        }
        let wal_start = Lsn(u64::from_be_bytes(buf[6..14].try_into().ok()?));
        let stream = self.decoder.stream();
        let head = decode_message_head(&buf[PAYLOAD_AT..], len - PAYLOAD_AT, stream.is_some())?;
        if filter.reads(head.prefix, head.content_len) {
            return None;
        }
        let change = Change::Message {
            transactional: head.transactional,
            lsn: head.lsn,
            prefix: head.prefix.to_owned(),
            content: Bytes::new(),
            xid: head.xid,
            left_out: Some(head.content_len),
        };
        let event = ReplicationEvent::Change {
            wal_start,
            change,
            stream,
        };
        Some((event, len))
    }

    /// Handles one message; `Some` when the stream is over.
    async fn frame(&mut self, frame: Frame) -> Result<Option<End>, WireError> {
        match frame.tag {
            b'd' => self.copy_data(frame.body.freeze()).await,
            b'c' => Err(WireError::Protocol("the server ended the stream".into())),
            _ => match parse(frame)? {
                Backend::ErrorResponse(body) => Err(server_error(body.fields()).in_stream()),
                Backend::NoticeResponse(_) | Backend::ParameterStatus(_) => Ok(None),
                Backend::CommandComplete(_) | Backend::ReadyForQuery(_) => {
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
                // wal_end and the server's clock: nothing walfold reads.
                data.advance(16);
                self.xlog(wal_start, data).await
            }
            b'k' => {
                if data.len() < 17 {
                    return Err(short());
                }
                let wal_end = Lsn(data.get_u64());
                let server_time_micros = data.get_i64();
                let reply_requested = data.get_u8() == 1;
                if reply_requested {
                    self.status().await?;
                }
                // A keepalive only moves the position: when the reader is behind, the
                // next one does the same, so it is dropped rather than waited for.
                if let Err(mpsc::error::TrySendError::Closed(_)) = self.out.try_send(Ok((
                    ReplicationEvent::KeepAlive {
                        wal_end,
                        reply_requested,
                        server_time_micros,
                    },
                    InFlightBytes::default(),
                ))) {
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

    async fn xlog(&mut self, wal_start: Lsn, data: Bytes) -> Result<Option<End>, WireError> {
        let (change, stream) = self.decoder.decode(&data).map_err(WireError::Decode)?;
        let boundary = change.boundary().map(Lsn);
        // What the message holds of the budget: nothing for a transaction's bounds, a
        // logical message's content, else the whole payload (a row borrows from it).
        let bytes = match &change {
            Change::Begin(_) | Change::Commit(_) => 0,
            Change::Message { content, .. } => content.len(),
            _ => data.len(),
        };
        drop(data);
        let event = ReplicationEvent::Change {
            wal_start,
            change,
            stream,
        };
        if !self.forward(event, bytes).await? {
            return Ok(Some(End::Stopped));
        }
        if let (Some(stop), Some(reached)) = (self.cfg.stop_lsn, boundary) {
            if reached >= stop {
                self.forward(ReplicationEvent::StoppedAt { reached }, 0)
                    .await?;
                return Ok(Some(End::Reached));
            }
        }
        Ok(None)
    }

    /// Takes the event's bytes from the budget, waiting while what is in flight holds
    /// it (status updates go on meanwhile). `None`: stop.
    async fn take(&mut self, bytes: usize) -> Result<Option<InFlightBytes>, WireError> {
        let Some(budget) = self.cfg.budget.clone() else {
            return Ok(Some(InFlightBytes::default()));
        };
        if let Some(held) = self.reserved.take() {
            return Ok(Some(held));
        }
        if let Some(held) = budget.try_take(bytes) {
            return Ok(Some(held));
        }
        let mut take = std::pin::pin!(budget.take(bytes));
        loop {
            let due = self.last_status + self.cfg.status_interval;
            tokio::select! {
                biased;
                _ = self.stop.changed() => return Ok(None),
                held = &mut take => return Ok(Some(held)),
                _ = tokio::time::sleep_until(due) => self.status().await?,
            }
        }
    }

    /// Hands an event to the reader. While the reader pushes back, status updates go on
    /// every `status_interval`, so the server keeps seeing a live client; the socket is
    /// not read meanwhile (TCP pushes back to the server). `false`: stop.
    async fn forward(&mut self, event: ReplicationEvent, bytes: usize) -> Result<bool, WireError> {
        let Some(held) = self.take(bytes).await? else {
            return Ok(false);
        };
        let event = (event, held);
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
                _ = tokio::time::sleep_until(due) => self.status().await?,
            }
        }
    }

    /// Sends a standby status update reporting the applied position as written,
    /// flushed and applied.
    async fn status(&mut self) -> Result<(), WireError> {
        let applied = self.progress.applied();
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(applied.0);
        body.put_u64(applied.0);
        body.put_u64(applied.0);
        body.put_i64(now_pg_micros());
        // A reply is asked for once the server has been quiet for a third of the
        // silence allowed: a live server answers with a keepalive at once.
        body.put_u8(u8::from(self.last_heard.elapsed() >= self.cfg.silence / 3));
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

fn now_pg_micros() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_micros() as i64;
    unix - PG_EPOCH_MICROS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::session::Io;
    use crate::wire::MessageFilter;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;
    use tokio::sync::Notify;

    fn config(status_interval: Duration) -> WireConfig {
        WireConfig {
            hosts: vec![("/tmp".into(), 5432)],
            read_write: false,
            expect: None,
            user: "u".into(),
            password: None,
            database: "d".into(),
            ssl_mode: walfold_pg::SslMode::Disable,
            root_cert: None,
            slot: "s".into(),
            publication: "p".into(),
            protocol: Some(2),
            settings: None,
            application_name: "t".into(),
            status_interval,
            silence: Duration::from_secs(3600),
            buffer: 1,
            stop_lsn: None,
            observer: None,
            budget: None,
            messages: None,
        }
    }

    type Events = mpsc::Receiver<Delivered>;

    /// A worker on one end of a socket pair; the test is the server on the other.
    fn worker(
        status_interval: Duration,
        capacity: usize,
    ) -> (UnixStream, Events, Arc<Progress>, watch::Sender<bool>) {
        worker_with(config(status_interval), capacity)
    }

    fn worker_with(
        cfg: WireConfig,
        capacity: usize,
    ) -> (UnixStream, Events, Arc<Progress>, watch::Sender<bool>) {
        let (ours, server) = UnixStream::pair().unwrap();
        let conn = Conn {
            io: Io::Unix(ours),
            buf: BytesMut::new(),
            skip: 0,
        };
        let (tx, rx) = mpsc::channel(capacity);
        let progress = Arc::new(Progress {
            applied: AtomicU64::new(0),
            raised: Notify::new(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let w = Worker::new(conn, cfg, tx, progress.clone(), stop_rx);
        tokio::spawn(w.run());
        (server, rx, progress, stop)
    }

    fn copy_data(body: &[u8]) -> Vec<u8> {
        let mut f = vec![b'd'];
        f.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    fn keepalive(wal_end: u64, reply: bool) -> Vec<u8> {
        let mut b = vec![b'k'];
        b.extend_from_slice(&wal_end.to_be_bytes());
        b.extend_from_slice(&0i64.to_be_bytes());
        b.push(u8::from(reply));
        copy_data(&b)
    }

    fn xlog(lsn: u64, data: &[u8]) -> Vec<u8> {
        let mut b = vec![b'w'];
        b.extend_from_slice(&lsn.to_be_bytes());
        b.extend_from_slice(&lsn.to_be_bytes());
        b.extend_from_slice(&0i64.to_be_bytes());
        b.extend_from_slice(data);
        copy_data(&b)
    }

    /// The flushed position of the next standby status update.
    async fn status(server: &mut UnixStream) -> u64 {
        let mut head = [0u8; 5];
        server.read_exact(&mut head).await.unwrap();
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize - 4;
        let mut body = vec![0u8; len];
        server.read_exact(&mut body).await.unwrap();
        assert_eq!((head[0], body[0]), (b'd', b'r'), "a standby status update");
        u64::from_be_bytes(body[9..17].try_into().unwrap())
    }

    /// A standby status update's reply-requested flag.
    async fn asks_for_reply(server: &mut UnixStream) -> bool {
        let mut head = [0u8; 5];
        server.read_exact(&mut head).await.unwrap();
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize - 4;
        let mut body = vec![0u8; len];
        server.read_exact(&mut body).await.unwrap();
        assert_eq!(
            (head[0], body[0], len),
            (b'd', b'r', 34),
            "a standby status update"
        );
        body[33] == 1
    }

    #[tokio::test]
    async fn a_silent_server_is_asked_for_a_reply_then_given_up_on() {
        let cfg = WireConfig {
            silence: Duration::from_millis(600),
            ..config(Duration::from_millis(100))
        };
        let (mut server, mut events, _progress, _stop) = worker_with(cfg, 8);
        assert!(!asks_for_reply(&mut server).await, "heard from just now");
        let mut asked = false;
        for _ in 0..5 {
            if asks_for_reply(&mut server).await {
                asked = true;
                break;
            }
        }
        assert!(
            asked,
            "quiet for a third of the silence allowed: a reply is asked for"
        );
        // A keepalive answers: the silence starts over.
        server.write_all(&keepalive(10, false)).await.unwrap();
        assert!(matches!(
            events.recv().await,
            Some(Ok((ReplicationEvent::KeepAlive { .. }, _)))
        ));
        let started = Instant::now();
        // The status updates go on meanwhile; the server reads and ignores them.
        tokio::spawn(async move {
            let mut sink = [0u8; 256];
            while server.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        let ended = events.recv().await;
        let error = ended
            .expect("an event")
            .expect_err("the connection given up on");
        assert!(
            error
                .to_string()
                .contains("no message from the source server"),
            "{error}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(500),
            "not before the silence"
        );
    }

    #[tokio::test]
    async fn a_keepalive_asking_for_a_reply_is_answered_at_once() {
        let (mut server, mut events, progress, _stop) = worker(Duration::from_secs(3600), 8);
        assert_eq!(status(&mut server).await, 0, "the first update on start");
        progress.applied.store(0x42, Ordering::Release);
        server.write_all(&keepalive(0x100, true)).await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(2), status(&mut server))
            .await
            .expect("an answer long before the status interval");
        assert_eq!(answered, 0x42);
        assert!(matches!(
            events.recv().await,
            Some(Ok((
                ReplicationEvent::KeepAlive {
                    wal_end: Lsn(0x100),
                    reply_requested: true,
                    ..
                },
                _
            )))
        ));
    }

    #[tokio::test]
    async fn status_updates_go_on_while_the_reader_pushes_back() {
        let (mut server, events, progress, _stop) = worker(Duration::from_millis(50), 1);
        status(&mut server).await;
        // The reader takes nothing: after one event the worker waits for room.
        for lsn in 1..=4u64 {
            server.write_all(&xlog(lsn, b"E")).await.unwrap();
        }
        progress.applied.store(7, Ordering::Release);
        progress.raised.notify_one();
        let mut reported = 0;
        for _ in 0..5 {
            reported = tokio::time::timeout(Duration::from_secs(2), status(&mut server))
                .await
                .expect("status updates while the reader is full");
        }
        assert_eq!(reported, 7);
        drop(events);
    }

    #[tokio::test]
    async fn a_raised_position_is_reported_without_waiting_for_the_interval() {
        let (mut server, _events, progress, _stop) = worker(Duration::from_secs(3600), 8);
        status(&mut server).await;
        progress.applied.store(0x99, Ordering::Release);
        progress.raised.notify_one();
        let reported = tokio::time::timeout(Duration::from_secs(2), status(&mut server))
            .await
            .expect("reported at once");
        assert_eq!(reported, 0x99);
    }

    fn message(prefix: &str, content: &[u8]) -> Vec<u8> {
        let mut b = vec![b'M', 1];
        b.extend_from_slice(&7u64.to_be_bytes());
        b.extend_from_slice(prefix.as_bytes());
        b.push(0);
        b.extend_from_slice(&(content.len() as u32).to_be_bytes());
        b.extend_from_slice(content);
        b
    }

    #[tokio::test]
    async fn a_large_message_not_read_whole_is_passed_on_without_its_content() {
        let mut cfg = config(Duration::from_secs(3600));
        cfg.messages = Some(MessageFilter {
            prefixes: vec!["orders".into()],
            max_bytes: 1_000_000,
        });
        let (mut server, mut events, _progress, _stop) = worker_with(cfg, 8);
        status(&mut server).await;
        let (_read, mut write) = server.into_split();
        tokio::spawn(async move {
            let frames = [
                xlog(1, &message("other", &vec![b'x'; 3_000_000])),
                xlog(2, &message("orders", &vec![b'y'; 2_000_000])),
                xlog(3, &message("orders", &vec![b'z'; 100_000])),
                keepalive(4, false),
            ];
            for frame in frames {
                // In pieces, as a socket delivers a large message.
                for piece in frame.chunks(8192) {
                    write.write_all(piece).await.unwrap();
                }
            }
            std::future::pending::<()>().await;
        });
        let mut seen = Vec::new();
        for _ in 0..4 {
            match events.recv().await {
                Some(Ok((
                    ReplicationEvent::Change {
                        change, wal_start, ..
                    },
                    _,
                ))) => match change {
                    Change::Message {
                        prefix,
                        content,
                        left_out,
                        ..
                    } => seen.push((wal_start.0, prefix, content.len(), left_out)),
                    other => panic!("unexpected {other:?}"),
                },
                Some(Ok((ReplicationEvent::KeepAlive { wal_end, .. }, _))) => {
                    seen.push((wal_end.0, "keepalive".into(), 0, None))
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            seen,
            [
                // A prefix walfold ignores, and one over max_bytes: left in the stream.
                (1, "other".to_owned(), 0, Some(3_000_000)),
                (2, "orders".to_owned(), 0, Some(2_000_000)),
                // Read whole, and the stream goes on where the discarded ones ended.
                (3, "orders".to_owned(), 100_000, None),
                (4, "keepalive".to_owned(), 0, None),
            ]
        );
    }
}
