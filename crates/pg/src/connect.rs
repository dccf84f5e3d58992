//! Opening SQL connections from a libpq-style URL, with TLS per `sslmode`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use tokio_postgres::config::{SslMode as PgSslMode, TargetSessionAttrs};
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;
use walfold_config::{conninfo, redact_url};

use crate::error::PgError;
use crate::tls::SslMode;

/// A URL split into what tokio-postgres understands and the TLS settings it does not.
#[derive(Clone)]
pub struct ConnectOptions {
    /// The URL without `sslmode`/`sslrootcert` (safe to hand to tokio-postgres).
    pub base_url: String,
    pub ssl_mode: SslMode,
    pub root_cert: Option<String>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("base_url", &redact_url(&self.base_url))
            .field("ssl_mode", &self.ssl_mode)
            .field("root_cert", &self.root_cert)
            .finish()
    }
}

impl ConnectOptions {
    /// Reads a URL or libpq's key=value pairs (`host=a,b port=5432,5433 dbname=app`).
    pub fn parse(url: &str) -> Result<ConnectOptions, PgError> {
        let bad = |reason: String| PgError::Url {
            url: redact_url(url),
            reason,
        };
        let ssl = |v: &str| match v {
            "disable" => Ok(SslMode::Disable),
            "prefer" | "allow" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            other => Err(bad(format!("unknown sslmode `{other}`"))),
        };
        let mut ssl_mode = SslMode::Prefer;
        let mut root_cert = None;
        let base_url = if conninfo::is_url(url) {
            let (base, query) = url.split_once('?').unwrap_or((url, ""));
            let mut rest = Vec::new();
            for kv in query.split('&').filter(|s| !s.is_empty()) {
                match kv.split_once('=') {
                    Some(("sslmode", v)) => ssl_mode = ssl(v)?,
                    Some(("sslrootcert", v)) => root_cert = Some(v.to_owned()),
                    Some(("target_session_attrs", "primary")) => {
                        rest.push("target_session_attrs=read-write")
                    }
                    _ => rest.push(kv),
                }
            }
            if rest.is_empty() {
                base.to_owned()
            } else {
                format!("{base}?{}", rest.join("&"))
            }
        } else {
            let mut rest = Vec::new();
            for (k, v) in conninfo::parse_pairs(url).map_err(bad)? {
                match (k.as_str(), v.as_str()) {
                    ("sslmode", v) => ssl_mode = ssl(v)?,
                    ("sslrootcert", _) => root_cert = Some(v),
                    ("target_session_attrs", "primary") => rest.push((k, "read-write".into())),
                    _ => rest.push((k, v)),
                }
            }
            conninfo::render_pairs(&rest)
        };
        Ok(ConnectOptions {
            base_url,
            ssl_mode,
            root_cert,
        })
    }

    /// The tokio-postgres config for this URL.
    pub fn pg_config(&self) -> Result<Config, PgError> {
        let mut config: Config = self.base_url.parse().map_err(|e| PgError::Url {
            url: redact_url(&self.base_url),
            reason: format!("{e}"),
        })?;
        config.ssl_mode(match self.ssl_mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            _ => PgSslMode::Require,
        });
        // Several hosts (a primary and its standbys): the one that accepts writes, as
        // libpq's `target_session_attrs=read-write` (walfold writes on both sides).
        if config.get_hosts().len() > 1
            && config.get_target_session_attrs() == TargetSessionAttrs::Any
        {
            config.target_session_attrs(TargetSessionAttrs::ReadWrite);
        }
        if config.get_application_name().is_none() {
            config.application_name("walfold");
        }
        // Notice a half-open connection in about a minute, not the OS default of hours.
        config
            .keepalives(true)
            .keepalives_idle(std::time::Duration::from_secs(30))
            .keepalives_interval(std::time::Duration::from_secs(10))
            .keepalives_retries(3);
        Ok(config)
    }
}

/// Connects and drives the connection on a background task. A server that accepts TCP
/// and never finishes the startup is given up on after [`DAEMON_CONNECT_TIMEOUT`] (an
/// error a daemon retries; a command says it), never waited on for the kernel's timeouts.
pub async fn connect(url: &str) -> Result<Client, PgError> {
    let connect = connect_tuned(url, |config| {
        config.connect_timeout(DAEMON_CONNECT_TIMEOUT);
    });
    match tokio::time::timeout(DAEMON_CONNECT_TIMEOUT, connect).await {
        Ok(result) => result,
        Err(_) => Err(PgError::NoAnswer {
            url: redact_url(url),
            within: DAEMON_CONNECT_TIMEOUT,
        }),
    }
}

/// How long any connection may take to be ready (TCP, TLS, authentication, startup).
pub const DAEMON_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The advisory-lock class of session tags (`'walI'`): a session of a process that
/// runs an instance holds `pg_advisory_lock_shared(SESSION_TAG_CLASS, tag)`, so the
/// server can list and end that instance's sessions (the store's `instance.rs`).
pub const SESSION_TAG_CLASS: i32 = 0x7761_6c49;

/// The tag that every session of this process holds once it runs an instance
/// (the store's `instance.rs`): drawn once per process.
static SESSION_TAG: OnceLock<i32> = OnceLock::new();

/// Whether this process tags its sessions: from its first instance on.
static TAGGING: AtomicBool = AtomicBool::new(false);

/// This process's session tag; from now on every session it opens holds it (see
/// [`SESSION_TAG_CLASS`]).
pub fn tag_sessions() -> i32 {
    TAGGING.store(true, Ordering::Relaxed);
    *SESSION_TAG.get_or_init(rand::random)
}

/// A notification on a channel a session listens to.
#[derive(Debug, Clone)]
pub struct Notice {
    pub channel: String,
    pub payload: String,
}

/// [`connect`], with the notifications the session receives (after `listen`) sent on
/// the returned channel; it closes when the connection does.
pub async fn connect_listening(
    url: &str,
) -> Result<(Client, tokio::sync::mpsc::UnboundedReceiver<Notice>), PgError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let client = open(url, |_| {}, Some(tx)).await?;
    Ok((client, rx))
}

/// [`connect`] with `tune` applied to the driver's config (timeouts): the one place a
/// walfold session is opened, so each pins its `search_path`.
pub(crate) async fn connect_tuned(
    url: &str,
    tune: impl FnOnce(&mut Config),
) -> Result<Client, PgError> {
    open(url, tune, None).await
}

async fn open(
    url: &str,
    tune: impl FnOnce(&mut Config),
    notices: Option<tokio::sync::mpsc::UnboundedSender<Notice>>,
) -> Result<Client, PgError> {
    let options = ConnectOptions::parse(url)?;
    let mut config = options.pg_config()?;
    tune(&mut config);
    let tls = MakeRustlsConnect::new(crate::tls::client_config(
        options.ssl_mode,
        options.root_cert.as_deref(),
    )?);
    let (client, mut connection) =
        config
            .connect(tls)
            .await
            .map_err(|source| PgError::Connect {
                url: redact_url(url),
                source,
            })?;
    tokio::spawn(async move {
        let Some(notices) = notices else {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "database connection closed");
            }
            return;
        };
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = futures::StreamExt::next(&mut messages).await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                    let _ = notices.send(Notice {
                        channel: n.channel().to_owned(),
                        payload: n.payload().to_owned(),
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "database connection closed");
                    break;
                }
            }
        }
    });
    let setup = match TAGGING.load(Ordering::Relaxed) {
        true => format!(
            "{PIN_SEARCH_PATH}; select pg_advisory_lock_shared({SESSION_TAG_CLASS}, {})",
            tag_sessions()
        ),
        false => PIN_SEARCH_PATH.to_owned(),
    };
    client
        .batch_execute(&setup)
        .await
        .map_err(PgError::db("pinning the session's search_path"))?;
    Ok(client)
}

/// Pins the session's `search_path` to the schemas it resolves to now, leaving out a
/// schema named after the role (`"$user"`) that another role owns: whoever may create
/// schemas in the database could otherwise make one under walfold's role name and
/// shadow the unqualified tables of a projection's SQL (its triggers would then run as
/// walfold). Schemas created later never join the path of an open session.
const PIN_SEARCH_PATH: &str = "select set_config('search_path', \
    coalesce(string_agg(quote_ident(s.name), ', ' order by s.i), ''), false) \
    from unnest(current_schemas(false)) with ordinality as s(name, i) \
    join pg_namespace n on n.nspname = s.name \
    where s.name <> current_user or pg_get_userbyid(n.nspowner) = current_user";

/// The server notices a vanished client within about a minute (its default is the
/// kernel's two hours), so a lock held by a dead session does not stall ingest for long;
/// and no statement timeout cuts an append short.
pub const SERVER_KEEPALIVES: &str = "set tcp_keepalives_idle = 30; \
    set tcp_keepalives_interval = 10; set tcp_keepalives_count = 3; set statement_timeout = 0;";

/// For projector sessions: half-open connections are noticed as above, and a
/// transaction left open by a client that vanished ends within a minute, so it cannot
/// hold the leader fence (or a read model's row locks) for long.
pub const WORKER_SESSION: &str = "set tcp_keepalives_idle = 30; \
    set tcp_keepalives_interval = 10; set tcp_keepalives_count = 3; \
    set idle_in_transaction_session_timeout = '60s';";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_tls_settings_from_the_url() {
        let o = ConnectOptions::parse(
            "postgresql://u:p@h:1/db?sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=5",
        )
        .unwrap();
        assert_eq!(o.ssl_mode, SslMode::VerifyFull);
        assert_eq!(o.root_cert.as_deref(), Some("/ca.pem"));
        assert_eq!(o.base_url, "postgresql://u:p@h:1/db?connect_timeout=5");
        assert!(ConnectOptions::parse("postgresql://h/db?sslmode=bogus").is_err());
        assert!(!format!("{o:?}").contains(":p@"), "{o:?}");
    }

    #[test]
    fn reads_key_value_pairs_with_several_hosts() {
        let o = ConnectOptions::parse(
            "host=a,/tmp port=5432,5433 dbname='my db' user=u password=p \
             sslmode=verify-ca sslrootcert=/ca.pem target_session_attrs=primary",
        )
        .unwrap();
        assert_eq!(o.ssl_mode, SslMode::VerifyCa);
        assert_eq!(o.root_cert.as_deref(), Some("/ca.pem"));
        let c = o.pg_config().unwrap();
        assert_eq!(
            c.get_hosts(),
            [
                tokio_postgres::config::Host::Tcp("a".into()),
                tokio_postgres::config::Host::Unix("/tmp".into())
            ]
        );
        assert_eq!(c.get_ports(), [5432, 5433]);
        assert_eq!(c.get_dbname(), Some("my db"));
        assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
        assert!(!format!("{o:?}").contains("'p'"), "{o:?}");
        // Two hosts without target_session_attrs: the one that accepts writes.
        let c = ConnectOptions::parse("host=a,b dbname=d")
            .unwrap()
            .pg_config()
            .unwrap();
        assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
        assert!(ConnectOptions::parse("host=a sslmode=bogus").is_err());
        let e = ConnectOptions::parse("host=a password='s3cret").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}
