//! Opening a replication session: TCP or Unix socket, TLS per `sslmode`, the startup
//! message with `replication=database`, authentication (cleartext, MD5, SCRAM-SHA-256),
//! then `START_REPLICATION` until the server answers with CopyBoth.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::backend::{ErrorFields, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use walfold_pg::SslMode;

use super::identify::Identity;
use super::{WireConfig, WireError};

/// The socket, encrypted or not.
pub(crate) enum Io {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

/// A socket with its read buffer: whole backend messages out.
pub(crate) struct Conn {
    pub(crate) io: Io,
    pub(crate) buf: BytesMut,
    /// Bytes of a message being discarded that are still to arrive (see
    /// [`Conn::discard`]).
    pub(crate) skip: usize,
}

/// One backend message: its tag and its body (without tag and length).
pub(crate) struct Frame {
    pub(crate) tag: u8,
    pub(crate) body: BytesMut,
}

/// Largest backend message accepted (PostgreSQL's own limit for a CopyData is 1 GB).
const MAX_FRAME: usize = 1 << 30;

impl Conn {
    /// A whole message from the buffer, if one is there (no I/O).
    pub(crate) fn try_frame(&mut self) -> Result<Option<Frame>, WireError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let tag = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if !(4..=MAX_FRAME).contains(&len) {
            return Err(WireError::Protocol(format!(
                "message {:?} of invalid length {len}",
                tag as char
            )));
        }
        if self.buf.len() < len + 1 {
            self.buf.reserve(len + 1 - self.buf.len());
            return Ok(None);
        }
        let mut frame = self.buf.split_to(len + 1);
        frame.advance(5);
        Ok(Some(Frame { tag, body: frame }))
    }

    /// The size of the message the buffer holds only the start of, once its length is
    /// known.
    pub(crate) fn incomplete(&self) -> Option<usize> {
        if self.buf.len() < 5 {
            return None;
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        (self.buf.len() < len + 1).then_some(len + 1)
    }

    /// Discards the message the buffer holds only the start of (`len` bytes in all):
    /// what is buffered now, and the rest as it arrives. Its buffer is given back.
    pub(crate) fn discard(&mut self, len: usize) {
        self.skip = len.saturating_sub(self.buf.len());
        self.buf = BytesMut::new();
    }

    /// Reads more bytes into the buffer; cancel-safe. EOF is an error.
    pub(crate) async fn fill(&mut self) -> Result<(), WireError> {
        if self.buf.capacity() - self.buf.len() < 8192 {
            self.buf.reserve(64 * 1024);
        }
        let n = self
            .io
            .read_buf(&mut self.buf)
            .await
            .map_err(WireError::io("reading from the source"))?;
        if n == 0 {
            return Err(WireError::Io {
                context: "reading from the source",
                source: std::io::ErrorKind::UnexpectedEof.into(),
            });
        }
        if self.skip > 0 {
            let n = self.skip.min(self.buf.len());
            self.buf.advance(n);
            self.skip -= n;
        }
        Ok(())
    }

    pub(crate) async fn frame(&mut self) -> Result<Frame, WireError> {
        loop {
            if let Some(f) = self.try_frame()? {
                return Ok(f);
            }
            self.fill().await?;
        }
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.io
            .write_all(bytes)
            .await
            .map_err(WireError::io("writing to the source"))?;
        self.io
            .flush()
            .await
            .map_err(WireError::io("writing to the source"))
    }
}

/// A logged-in replication session (not streaming yet).
pub(crate) struct Login {
    pub(crate) conn: Conn,
    pub(crate) server_version: u32,
    pub(crate) server_encoding: String,
}

/// Logs in to `host:port` with `replication=database`.
pub(crate) async fn login(cfg: &WireConfig, host: &str, port: u16) -> Result<Login, WireError> {
    let io = socket(cfg, host, port).await?;
    let mut conn = Conn {
        skip: 0,
        io,
        buf: BytesMut::with_capacity(64 * 1024),
    };
    let mut out = BytesMut::new();
    let params = [
        ("user", cfg.user.as_str()),
        ("database", cfg.database.as_str()),
        ("replication", "database"),
        ("client_encoding", "UTF8"),
        ("application_name", cfg.application_name.as_str()),
    ];
    frontend::startup_message(params, &mut out)
        .map_err(WireError::io("encoding the startup message"))?;
    conn.send(&out).await?;
    let (server_version, server_encoding) = authenticate(&mut conn, cfg)
        .await
        .map_err(|e| pooler_refusal(e, host, port))?;
    if let Some(settings) = &cfg.settings {
        simple_query(&mut conn, settings).await?;
    }
    Ok(Login {
        conn,
        server_version,
        server_encoding,
    })
}

/// Opens a session that is streaming from the slot, on the primary among the
/// configured hosts. Returns it with the server's `server_version_num`, the protocol
/// version in use and the server's identity.
pub(crate) async fn open(cfg: &WireConfig) -> Result<(Conn, u32, u8, Identity), WireError> {
    let (login, identity) = super::identify::primary(cfg).await?;
    if let Some((system_id, timeline)) = &cfg.expect {
        if (system_id, *timeline) != (&identity.system_id, identity.timeline) {
            return Err(WireError::NoPrimary(format!(
                "{} is system {} on timeline {}, not the one checked (system {system_id}, \
                 timeline {timeline}): the source changed meanwhile",
                identity.host, identity.system_id, identity.timeline
            )));
        }
    }
    let Login {
        mut conn,
        server_version,
        server_encoding,
    } = login;
    if server_encoding == "SQL_ASCII" {
        // A SQL_ASCII database holds bytes in no encoding; converting them to UTF8 fails
        // the whole stream (22021) on the first byte that is not UTF-8. Taken as they
        // are, valid UTF-8 flows and any other row is a dead letter ("not UTF-8").
        simple_query(&mut conn, "set client_encoding = 'SQL_ASCII'").await?;
    }
    // Streaming of in-progress transactions (protocol 2) came with PostgreSQL 14.
    let protocol = match cfg.protocol {
        Some(2) if server_version < 140000 => {
            return Err(WireError::Unsupported(format!(
                "source.protocol = 2 needs PostgreSQL 14 or later; the source is {server_version}. \
                 Fix: set source.protocol = 1, or remove it"
            )))
        }
        Some(p) => p,
        None if server_version >= 140000 => 2,
        None => 1,
    };
    start(&mut conn, cfg, protocol, server_version >= 140_000).await?;
    Ok((conn, server_version, protocol, identity))
}

async fn socket(cfg: &WireConfig, host: &str, port: u16) -> Result<Io, WireError> {
    if host.starts_with('/') {
        let path = format!("{host}/.s.PGSQL.{port}");
        let s = tokio::net::UnixStream::connect(path)
            .await
            .map_err(WireError::io("connecting to the source"))?;
        return Ok(Io::Unix(s));
    }
    let mut tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(WireError::io("connecting to the source"))?;
    let _ = tcp.set_nodelay(true);
    if cfg.ssl_mode == SslMode::Disable {
        return Ok(Io::Tcp(tcp));
    }
    let mut out = BytesMut::new();
    frontend::ssl_request(&mut out);
    tcp.write_all(&out)
        .await
        .map_err(WireError::io("requesting TLS"))?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .await
        .map_err(WireError::io("requesting TLS"))?;
    match answer[0] {
        b'S' => {}
        b'N' if cfg.ssl_mode == SslMode::Prefer => return Ok(Io::Tcp(tcp)),
        b'N' => {
            return Err(WireError::Tls(format!(
                "the source server does not accept TLS but sslmode is {:?}",
                cfg.ssl_mode
            )))
        }
        other => {
            return Err(WireError::Protocol(format!(
                "unexpected answer {other:#x} to the TLS request"
            )))
        }
    }
    let config = walfold_pg::tls_client_config(cfg.ssl_mode, cfg.root_cert.as_deref())
        .map_err(|e| WireError::Tls(e.to_string()))?;
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| WireError::Tls(format!("host {host}: {e}")))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        // A refused certificate or TLS protocol error is the environment's; a connection
        // cut during the handshake (a failover) is transient.
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => WireError::Tls(e.to_string()),
            _ => WireError::io("the TLS handshake")(e),
        })?;
    Ok(Io::Tls(Box::new(tls)))
}

/// Runs a statement that returns no rows, up to ReadyForQuery.
async fn simple_query(conn: &mut Conn, sql: &str) -> Result<(), WireError> {
    let mut out = BytesMut::new();
    frontend::query(sql, &mut out).map_err(WireError::io("encoding a query"))?;
    conn.send(&out).await?;
    let mut failed = None;
    loop {
        match parse(conn.frame().await?)? {
            Message::ReadyForQuery(_) => return failed.map_or(Ok(()), Err),
            Message::ErrorResponse(body) => failed = Some(server_error(body.fields())),
            Message::CommandComplete(_)
            | Message::EmptyQueryResponse
            | Message::NoticeResponse(_)
            | Message::ParameterStatus(_) => {}
            _ => return Err(WireError::Protocol(format!("unexpected answer to `{sql}`"))),
        }
    }
}

/// Runs a statement and returns its rows, each column as text (`None`: null).
pub(crate) async fn rows(
    conn: &mut Conn,
    sql: &str,
) -> Result<Vec<Vec<Option<String>>>, WireError> {
    let mut out = BytesMut::new();
    frontend::query(sql, &mut out).map_err(WireError::io("encoding a query"))?;
    conn.send(&out).await?;
    let mut failed = None;
    let mut rows = Vec::new();
    loop {
        match parse(conn.frame().await?)? {
            Message::ReadyForQuery(_) => return failed.map_or(Ok(rows), Err),
            Message::ErrorResponse(body) => failed = Some(server_error(body.fields())),
            Message::DataRow(body) => {
                let buf = body.buffer();
                let mut ranges = body.ranges();
                let mut row = Vec::new();
                while let Some(range) = ranges
                    .next()
                    .map_err(|e| WireError::Protocol(e.to_string()))?
                {
                    row.push(range.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()));
                }
                rows.push(row);
            }
            Message::RowDescription(_)
            | Message::CommandComplete(_)
            | Message::EmptyQueryResponse
            | Message::NoticeResponse(_)
            | Message::ParameterStatus(_) => {}
            _ => return Err(WireError::Protocol(format!("unexpected answer to `{sql}`"))),
        }
    }
}

/// Runs the authentication exchange up to ReadyForQuery; the server's
/// `server_version_num` and `server_encoding`.
async fn authenticate(conn: &mut Conn, cfg: &WireConfig) -> Result<(u32, String), WireError> {
    let password = || {
        cfg.password.as_deref().ok_or_else(|| {
            WireError::Auth("the server asks for a password and source.url has none".into())
        })
    };
    let mut scram: Option<ScramSha256> = None;
    let mut server_version = 0;
    let mut server_encoding = String::new();
    loop {
        let frame = conn.frame().await?;
        let mut out = BytesMut::new();
        match parse(frame)? {
            Message::AuthenticationOk => {}
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(password()?.as_bytes(), &mut out)
                    .map_err(WireError::io("encoding the password"))?;
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = md5_hash(cfg.user.as_bytes(), password()?.as_bytes(), body.salt());
                frontend::password_message(hash.as_bytes(), &mut out)
                    .map_err(WireError::io("encoding the password"))?;
            }
            Message::AuthenticationSasl(body) => {
                let mut mechanisms = body.mechanisms();
                let mut offered = false;
                while let Some(m) = mechanisms
                    .next()
                    .map_err(|e| WireError::Protocol(e.to_string()))?
                {
                    offered |= m == SCRAM_SHA_256;
                }
                if !offered {
                    return Err(WireError::Auth(
                        "the server offers no SASL mechanism walfold supports (SCRAM-SHA-256)"
                            .into(),
                    ));
                }
                // Channel binding is not used: TLS verify-full already authenticates the
                // server, and 'n' is accepted whatever the server offers.
                let s = ScramSha256::new(password()?.as_bytes(), ChannelBinding::unsupported());
                frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut out)
                    .map_err(WireError::io("encoding SCRAM"))?;
                scram = Some(s);
            }
            Message::AuthenticationSaslContinue(body) => {
                let s = scram
                    .as_mut()
                    .ok_or_else(|| WireError::Protocol("SASL continue before SASL".into()))?;
                s.update(body.data())
                    .map_err(|e| WireError::Auth(e.to_string()))?;
                frontend::sasl_response(s.message(), &mut out)
                    .map_err(WireError::io("encoding SCRAM"))?;
            }
            Message::AuthenticationSaslFinal(body) => {
                let s = scram
                    .as_mut()
                    .ok_or_else(|| WireError::Protocol("SASL final before SASL".into()))?;
                s.finish(body.data())
                    .map_err(|e| WireError::Auth(format!("the server's SCRAM proof: {e}")))?;
            }
            Message::ParameterStatus(body) => {
                let name = body
                    .name()
                    .map_err(|e| WireError::Protocol(e.to_string()))?;
                let value = || body.value().map_err(|e| WireError::Protocol(e.to_string()));
                match name {
                    "server_version" => server_version = version_num(value()?),
                    "server_encoding" => server_encoding = value()?.to_owned(),
                    _ => {}
                }
            }
            Message::ReadyForQuery(_) => return Ok((server_version, server_encoding)),
            Message::ErrorResponse(body) => return Err(server_error(body.fields())),
            Message::BackendKeyData(_) | Message::NoticeResponse(_) => {}
            _ => {
                return Err(WireError::Auth(
                    "the server asks for an authentication method walfold does not support".into(),
                ))
            }
        }
        if !out.is_empty() {
            conn.send(&out).await?;
        }
    }
}

/// Sends START_REPLICATION and waits for CopyBothResponse.
async fn start(
    conn: &mut Conn,
    cfg: &WireConfig,
    protocol: u8,
    messages: bool,
) -> Result<(), WireError> {
    let streaming = if protocol >= 2 {
        ", streaming 'on'"
    } else {
        ""
    };
    // pgoutput takes `messages` from PostgreSQL 14 on; before, heartbeats are not seen
    // (keepalives still move the position between transactions).
    let messages = if messages { ", messages 'true'" } else { "" };
    // Slot names hold only [a-z0-9_]; the publication is quoted by the caller and its
    // single quotes (none in a validated name) are doubled for the option value.
    let sql = format!(
        "START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version '{}'{streaming}, \
         publication_names '{}'{messages})",
        cfg.slot,
        protocol,
        cfg.publication.replace('\'', "''"),
    );
    let mut out = BytesMut::new();
    frontend::query(&sql, &mut out).map_err(WireError::io("encoding START_REPLICATION"))?;
    conn.send(&out).await?;
    loop {
        let frame = conn.frame().await?;
        if frame.tag == b'W' {
            return Ok(());
        }
        match parse(frame)? {
            Message::ErrorResponse(body) => return Err(server_error(body.fields())),
            Message::NoticeResponse(_) | Message::ParameterStatus(_) => {}
            _ => {
                return Err(WireError::Protocol(
                    "unexpected answer to START_REPLICATION".into(),
                ))
            }
        }
    }
}

/// Parses a frame with postgres-protocol (which does not know CopyBothResponse).
pub(crate) fn parse(frame: Frame) -> Result<Message, WireError> {
    let mut whole = BytesMut::with_capacity(frame.body.len() + 5);
    whole.extend_from_slice(&[frame.tag]);
    whole.extend_from_slice(&((frame.body.len() + 4) as u32).to_be_bytes());
    whole.extend_from_slice(&frame.body);
    Message::parse(&mut whole)
        .map_err(|e| WireError::Protocol(e.to_string()))?
        .ok_or_else(|| WireError::Protocol("truncated message".into()))
}

pub(crate) fn server_error(mut fields: ErrorFields<'_>) -> WireError {
    let (mut code, mut message) = (None, String::new());
    while let Ok(Some(f)) = fields.next() {
        let value = String::from_utf8_lossy(f.value_bytes()).into_owned();
        match f.type_() {
            b'C' => code = Some(value),
            b'M' => message = value,
            _ => {}
        }
    }
    WireError::Server { code, message }
}

/// A pooler that refuses the replication connection's startup (told in
/// `walfold_event::is_pooler_startup_refusal`). Any other error is returned as it is.
fn pooler_refusal(e: WireError, host: &str, port: u16) -> WireError {
    match e {
        WireError::Server { message, .. } if walfold_event::is_pooler_startup_refusal(&message) => {
            WireError::Unsupported(format!(
                "the source at {host}:{port} refused the replication connection ({message}): a \
                 connection pooler such as PgBouncer is in front of it, and walfold's \
                 replication connection needs PostgreSQL itself. Fix: point source.url at \
                 the server directly, not at the pooler"
            ))
        }
        other => other,
    }
}

/// `15.4` → 150004, `9.6.1` → 90601.
fn version_num(v: &str) -> u32 {
    let mut parts = v
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    if major >= 10 {
        major * 10000 + minor
    } else {
        major * 10000 + minor * 100 + parts.next().unwrap_or(0)
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Unix(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::version_num;

    #[test]
    fn server_versions_become_numbers() {
        assert_eq!(version_num("15.4"), 150004);
        assert_eq!(version_num("14.10 (Debian 14.10-1)"), 140010);
        assert_eq!(version_num("9.6.24"), 90624);
    }
}
