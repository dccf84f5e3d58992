//! Which server a replication session reached: `IDENTIFY_SYSTEM` (the system
//! identifier, the timeline, the WAL position), whether it is in recovery (a standby),
//! and `TIMELINE_HISTORY`. Among several configured hosts the primary is the one that is
//! not in recovery: a standby cannot decode, and after a failover the old primary may
//! come back as one.

use walfold_event::Lsn;

use super::session::{login, rows, Login};
use super::{WireConfig, WireError};

/// What `IDENTIFY_SYSTEM` and `pg_is_in_recovery()` say about the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The cluster's system identifier: the same on a primary and its physical
    /// standbys, different on any other cluster.
    pub system_id: String,
    pub timeline: u32,
    /// The server's current WAL position.
    pub wal_position: Lsn,
    pub in_recovery: bool,
    /// `host:port` as configured.
    pub host: String,
}

/// Reads the identity on a logged-in session.
pub(crate) async fn identify(
    login: &mut Login,
    host: &str,
    port: u16,
) -> Result<Identity, WireError> {
    let bad = |what: &str| WireError::Protocol(format!("IDENTIFY_SYSTEM: {what}"));
    // First: a server out of recovery stays out, so the timeline read next is the
    // promoted one (read the other way round, a promotion in between would pair the
    // standby's old timeline with "not in recovery").
    let in_recovery = rows(&mut login.conn, "select pg_is_in_recovery()")
        .await?
        .first()
        .and_then(|r| r.first().cloned().flatten())
        .is_some_and(|v| v == "t");
    let row = rows(&mut login.conn, "IDENTIFY_SYSTEM")
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| bad("no row"))?;
    let col = |i: usize| {
        row.get(i)
            .cloned()
            .flatten()
            .ok_or_else(|| bad("a null column"))
    };
    let system_id = col(0)?;
    let timeline = col(1)?.parse().map_err(|_| bad("timeline"))?;
    let wal_position = col(2)?.parse().map_err(|_| bad("xlogpos"))?;
    Ok(Identity {
        system_id,
        timeline,
        wal_position,
        in_recovery,
        host: format!("{host}:{port}"),
    })
}

/// Logs in to the primary: the first configured host that answers and is not in
/// recovery (with one host and no `target_session_attrs=read-write`, whatever it is).
pub(crate) async fn primary(cfg: &WireConfig) -> Result<(Login, Identity), WireError> {
    let choose = cfg.read_write || cfg.hosts.len() > 1;
    let mut failures = Vec::new();
    let mut last = None;
    for (host, port) in &cfg.hosts {
        let attempt = async {
            let mut login = login(cfg, host, *port).await?;
            let identity = identify(&mut login, host, *port).await?;
            Ok::<_, WireError>((login, identity))
        };
        match attempt.await {
            Ok((_, identity)) if choose && identity.in_recovery => {
                failures.push(format!("{host}:{port} is a standby"));
            }
            Ok(found) => return Ok(found),
            // A wrong password or certificate is wrong on every host.
            Err(e @ (WireError::Auth(_) | WireError::Tls(_))) => return Err(e),
            Err(e) => {
                failures.push(format!("{host}:{port}: {e}"));
                last = Some(e);
            }
        }
    }
    match (cfg.hosts.len(), last) {
        (1, Some(e)) => Err(e),
        _ => Err(WireError::NoPrimary(failures.join("; "))),
    }
}

/// The primary's identity and, when its timeline is not `known` (and not the first),
/// its timeline history file.
pub async fn probe(
    cfg: &WireConfig,
    known: Option<u32>,
) -> Result<(Identity, Option<String>), WireError> {
    let (mut login, identity) = primary(cfg).await?;
    let history = if identity.timeline > 1 && known != Some(identity.timeline) {
        let row = rows(
            &mut login.conn,
            &format!("TIMELINE_HISTORY {}", identity.timeline),
        )
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| WireError::Protocol("TIMELINE_HISTORY: no row".into()))?;
        row.get(1).cloned().flatten()
    } else {
        None
    };
    Ok((identity, history))
}
