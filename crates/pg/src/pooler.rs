//! Recognising a pooler that shares server sessions between its clients (PgBouncer with
//! `pool_mode = transaction` or `statement`) in front of a URL walfold needs a session
//! on: its leader lock, prepared statements and `search_path` live in the server
//! backend, and such a pooler hands the next statement outside a transaction to
//! whichever backend is free. Through it the leader lock outlives a killed leader on a
//! pooled backend, prepared statements vanish (26000) and two instances can both lead.
//!
//! How it is told apart: a session keeps one backend (`pg_backend_pid()`) for its
//! whole life, and two sessions never share one. Two connections read their backend's
//! pid outside a transaction, then again while the second holds a transaction open
//! (so the first cannot be handed the second's backend): one pid seen twice across the
//! connections, or a pid that changes on one, is a pooler sharing sessions. A session
//! pool (`pool_mode = session`) and PostgreSQL itself pass.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage};
use walfold_config::redact_url;

use crate::deadline::connect_within;
use crate::error::PgError;

/// Rounds of the check: one is enough behind PgBouncer's default LIFO reuse of server
/// connections; more catch a pool that hands out backends round robin.
const ROUNDS: usize = 3;

/// How long one step may take before the check gives up as inconclusive.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a URL's connections are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pooling {
    /// Each connection keeps its own server session (PostgreSQL, or a session pool).
    Session,
    /// A pooler shares server sessions between clients; `evidence` says what was seen.
    Shared { evidence: String },
    /// The check could not finish (a step timed out); `reason` says which.
    Unknown { reason: String },
}

/// Whether `url` leads to its own server sessions or to a pooler that shares them.
/// Opens two short-lived connections; an error is a failure to connect or to run the
/// check's statements.
pub async fn pooling(url: &str) -> Result<Pooling, PgError> {
    // Within a bound like every other step: a server that accepts TCP and never answers
    // must not hold a start (or every ingest reconnect) for the kernel's timeouts.
    let first = connect_within(url, "the pooler check", STEP_TIMEOUT).await?;
    let second = connect_within(url, "the pooler check", STEP_TIMEOUT).await?;
    let mut seen = [BTreeSet::new(), BTreeSet::new()];
    for _ in 0..ROUNDS {
        if let Some(verdict) = round(&first, &second, &mut seen).await? {
            return Ok(verdict);
        }
    }
    Ok(Pooling::Session)
}

/// One round of the check; `Some` once it has a verdict other than "a session so far".
async fn round(
    first: &Client,
    second: &Client,
    seen: &mut [BTreeSet<i32>; 2],
) -> Result<Option<Pooling>, PgError> {
    let Some(pid) = step(backend_pid(first), "reading the first connection's backend").await?
    else {
        return Ok(Some(timed_out("reading the first connection's backend")));
    };
    seen[0].insert(pid);
    let Some(pid) = step(
        backend_pid(second),
        "reading the second connection's backend",
    )
    .await?
    else {
        return Ok(Some(timed_out("reading the second connection's backend")));
    };
    seen[1].insert(pid);
    if let Some(shared) = verdict(seen) {
        return Ok(Some(shared));
    }
    // A statement pooler refuses a transaction block: its error is the evidence. Losing
    // the connection instead is an error like any other.
    match step(second.simple_query("begin"), "opening a transaction").await {
        Ok(Some(_)) => {}
        Ok(None) => return Ok(Some(timed_out("opening a transaction"))),
        Err(PgError::Db { source, .. }) if source.as_db_error().is_some() => {
            return Ok(Some(Pooling::Shared {
                evidence: format!(
                    "a transaction block was refused ({})",
                    crate::error::describe(&source)
                ),
            }))
        }
        Err(e) => return Err(e),
    }
    let inside = step(
        backend_pid(second),
        "reading the backend inside a transaction",
    )
    .await?;
    // With the second connection's backend held by its transaction, a pooler that
    // shares sessions must serve the first from another one.
    let outside = step(backend_pid(first), "reading the first connection's backend").await?;
    let (Some(inside), Some(outside)) = (inside, outside) else {
        return Ok(Some(timed_out(
            "reading a backend while another connection holds a transaction",
        )));
    };
    seen[1].insert(inside);
    seen[0].insert(outside);
    step(second.simple_query("rollback"), "ending the transaction").await?;
    Ok(verdict(seen))
}

/// A pooler's evidence in the pids each connection has seen, if there is any.
fn verdict(seen: &[BTreeSet<i32>; 2]) -> Option<Pooling> {
    let evidence = if let Some(pid) = seen[0].intersection(&seen[1]).next() {
        format!("two connections were served by the same server backend (pid {pid})")
    } else if let Some(pids) = seen.iter().find(|s| s.len() > 1) {
        let pids: Vec<String> = pids.iter().map(i32::to_string).collect();
        format!(
            "one connection was served by several server backends (pids {})",
            pids.join(", ")
        )
    } else {
        return None;
    };
    Some(Pooling::Shared { evidence })
}

fn timed_out(what: &str) -> Pooling {
    Pooling::Unknown {
        reason: format!("{what} took more than {} s", STEP_TIMEOUT.as_secs()),
    }
}

/// Runs one step of the check within [`STEP_TIMEOUT`]; `None` when it took longer.
async fn step<T>(
    future: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    context: &'static str,
) -> Result<Option<T>, PgError> {
    match tokio::time::timeout(STEP_TIMEOUT, future).await {
        Ok(result) => result.map(Some).map_err(PgError::db(context)),
        Err(_) => Ok(None),
    }
}

/// The pid of the backend serving `client`'s next statement. A simple query: an
/// extended-protocol statement is prepared and run in two round trips, which a pooler
/// sharing sessions may send to two backends.
async fn backend_pid(client: &Client) -> Result<i32, tokio_postgres::Error> {
    let messages = client.simple_query("select pg_backend_pid()").await?;
    let pid = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.try_get(0).ok().flatten(),
        _ => None,
    });
    // The server always answers with one row; anything else cannot be compared.
    Ok(pid.and_then(|p: &str| p.parse().ok()).unwrap_or(-1))
}

/// The URLs this process found to keep their sessions.
fn checked() -> &'static std::sync::Mutex<BTreeSet<String>> {
    static CHECKED: std::sync::OnceLock<std::sync::Mutex<BTreeSet<String>>> =
        std::sync::OnceLock::new();
    CHECKED.get_or_init(Default::default)
}

/// Refuses `url` when a pooler there shares server sessions: walfold needs a session of
/// its own on it. `key` names the URL for the fix (`source.url`, `the target URL`). An
/// inconclusive check is logged and passes: walfold does not refuse on a guess.
///
/// A URL found to keep its sessions is not checked again in this process: what sits
/// behind a URL does not change between reconnects, and the check costs two
/// connections (ingest reconnects after every transient error).
pub async fn refuse_pooling(url: &str, key: &str) -> Result<(), PgError> {
    if checked()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(url)
    {
        return Ok(());
    }
    match pooling(url).await? {
        Pooling::Session => {
            checked()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(url.to_owned());
            Ok(())
        }
        Pooling::Shared { evidence } => Err(PgError::Pooled {
            key: key.to_owned(),
            url: redact_url(url),
            evidence,
        }),
        Pooling::Unknown { reason } => {
            tracing::warn!(url = %redact_url(url), %reason, "cannot tell whether a pooler shares sessions behind this url");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(first: &[i32], second: &[i32]) -> [BTreeSet<i32>; 2] {
        [
            first.iter().copied().collect(),
            second.iter().copied().collect(),
        ]
    }

    #[test]
    fn a_backend_shared_or_changed_is_a_pooler() {
        assert_eq!(verdict(&seen(&[10], &[11])), None);
        assert!(matches!(
            verdict(&seen(&[10], &[10])),
            Some(Pooling::Shared { evidence }) if evidence.contains("same server backend (pid 10)")
        ));
        assert!(matches!(
            verdict(&seen(&[10, 12], &[11])),
            Some(Pooling::Shared { evidence }) if evidence.contains("pids 10, 12")
        ));
    }
}
