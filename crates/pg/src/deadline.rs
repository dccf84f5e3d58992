//! Deadlines for the connections that must answer within seconds: those of the one-shot
//! commands (`status`, `doctor`, `dead-letters`, `events`, ...) and of the metrics
//! scrape. A server that does not answer (a silent partition, a stuck proxy) is named,
//! with its URL redacted, instead of hanging the operator's terminal.

use std::future::Future;
use std::time::Duration;

use crate::error::PgError;
use tokio_postgres::Client;
use walfold_config::redact_url;

/// How long a command waits for a server to accept a connection (TCP, TLS, startup).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a command waits for one statement (server side) or one step of its work
/// on a server (client side, [`answer_within`]).
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// An error that can say which server it came from (`source default`, `target main`):
/// what [`answer_within`] returns, whatever the work's own error type.
pub trait ServerError: From<PgError> {
    /// This error, as `server`'s.
    fn at_server(self, server: &str) -> Self;
}

impl ServerError for PgError {
    fn at_server(self, server: &str) -> Self {
        PgError::Server {
            server: server.to_owned(),
            source: Box::new(self),
        }
    }
}

/// Connects to `server` (as the operator knows it: `source default`, `target main`)
/// at `url` within [`CONNECT_TIMEOUT`], with a server-side statement timeout of
/// [`STATEMENT_TIMEOUT`] and a TCP user timeout, so that a partition after connecting
/// ends the command's next statement instead of hanging it.
pub async fn connect_for_command(url: &str, server: &str) -> Result<Client, PgError> {
    let client = connect_within(url, server, CONNECT_TIMEOUT).await?;
    let set = format!("set statement_timeout = {}", STATEMENT_TIMEOUT.as_millis());
    answer_within(url, server, CONNECT_TIMEOUT, async {
        client
            .batch_execute(&set)
            .await
            .map_err(PgError::db("setting the statement timeout"))
    })
    .await?;
    Ok(client)
}

/// Connects to `server` at `url`, giving up after `within`.
pub async fn connect_within(url: &str, server: &str, within: Duration) -> Result<Client, PgError> {
    let connect = crate::connect::connect_tuned(url, |config| {
        config
            .connect_timeout(within)
            .tcp_user_timeout(STATEMENT_TIMEOUT);
    });
    answer_within(url, server, within, connect).await
}

/// Runs `work` against `server` at `url`, giving up after `within`; either way an
/// error names the server.
pub async fn answer_within<T, E: ServerError>(
    url: &str,
    server: &str,
    within: Duration,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    match tokio::time::timeout(within, work).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.at_server(server)),
        Err(_) => Err(E::from(PgError::NoAnswer {
            url: redact_url(url),
            within,
        })
        .at_server(server)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_server_that_accepts_and_never_answers_is_named() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts, then holds the socket without a word.
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                open.push(s);
            }
        });
        let url = format!("postgresql://u:hunter2@127.0.0.1:{port}/db?sslmode=disable");
        let started = std::time::Instant::now();
        let Err(e) = connect_within(&url, "source default", Duration::from_millis(300)).await
        else {
            panic!("a server that never answers connected");
        };
        assert!(started.elapsed() < Duration::from_secs(2));
        let text = e.to_string();
        assert_eq!(
            text,
            format!(
                "source default: did not answer within 0.3 s (postgresql://u:***@127.0.0.1:{port}/db?sslmode=disable)"
            )
        );
        held.abort();
    }
}
