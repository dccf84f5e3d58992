//! `GET /wait` on the metrics listener: read your own writes over HTTP. The question and
//! the answer are `wait_for`'s (walfold's SQL function on the main target, one place for
//! the rule): `?projection=P&lsn=0/16B3748[&timeout_ms=2000][&source=S]
//! [&aggregate_type=T&aggregate_id=ID]` answers JSON, 200 when folded, 504 at the timeout,
//! 409 with the reason when it cannot be (paused, parked, a dead letter), 404 for an
//! unknown projection or source, 400 for a bad request or a position from the future.
//! Each wait holds one connection to the main target while it waits (kept for the next
//! one); at most [`MAX_WAITS`] wait at once, more are answered 503 at once.

use std::time::Duration;

use hyper::StatusCode;
use tokio::sync::{Mutex, Semaphore};
use tokio_postgres::Client;
use walfold_config::Config;
use walfold_event::Lsn;
use walfold_store::wait::{self, WaitRequest, WaitStatus};
use walfold_store::Schema;

/// Waits served at once.
pub const MAX_WAITS: usize = 32;
/// The longest wait asked for (the listener closes a connection after 20 s).
const MAX_TIMEOUT: Duration = Duration::from_secs(15);
/// The wait when the request names none.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to the target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections of waits, kept between them, and the cap on waits at once.
pub struct Waits {
    idle: Mutex<Vec<Client>>,
    slots: Semaphore,
}

impl Default for Waits {
    fn default() -> Self {
        Waits {
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(MAX_WAITS),
        }
    }
}

/// Answers `GET /wait?query`: (status code, JSON body).
pub async fn answer(config: &Config, waits: &Waits, query: &str) -> (StatusCode, String) {
    let request = match parse(query) {
        Ok(r) => r,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let Ok(_slot) = waits.slots.try_acquire() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("{MAX_WAITS} waits are already waiting: try again, or wait from SQL"),
        );
    };
    let kept = waits.idle.lock().await.pop().filter(|c| !c.is_closed());
    let client = match kept {
        Some(c) => c,
        None => {
            match walfold_pg::connect_within(config.target_url(), "target main", CONNECT_TIMEOUT)
                .await
            {
                Ok(c) => c,
                Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
            }
        }
    };
    let schema = Schema::new(config.target.schema.as_str());
    let answer = wait::wait_for(&client, &schema, &request).await;
    waits.idle.lock().await.push(client);
    match answer {
        Ok(a) => {
            let code = match a.status {
                WaitStatus::Folded => StatusCode::OK,
                WaitStatus::Timeout => StatusCode::GATEWAY_TIMEOUT,
                WaitStatus::Paused | WaitStatus::Parked | WaitStatus::DeadLetter => {
                    StatusCode::CONFLICT
                }
            };
            let body = serde_json::json!({
                "status": a.status.as_str(),
                "projection": request.projection,
                "subscriber": a.subscriber,
                "lsn": request.lsn.to_string(),
                "reason": a.reason,
                "event_id": a.event_id,
                "waited_ms": a.waited_ms,
            });
            (code, format!("{body}\n"))
        }
        Err(e) => {
            let code = match e.pg().and_then(|e| e.code()).map(|c| c.code()) {
                Some("42704") => StatusCode::NOT_FOUND,
                Some("22023") | Some("25000") => StatusCode::BAD_REQUEST,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            let why = e
                .pg()
                .and_then(|e| e.as_db_error())
                .map_or_else(|| e.to_string(), |d| d.message().to_owned());
            error(code, &why)
        }
    }
}

fn error(code: StatusCode, why: &str) -> (StatusCode, String) {
    (
        code,
        format!(
            "{}\n",
            serde_json::json!({ "status": "error", "error": why })
        ),
    )
}

/// The request from the query string.
fn parse(query: &str) -> Result<WaitRequest, String> {
    let (mut projection, mut lsn, mut timeout, mut source) = (None, None, DEFAULT_TIMEOUT, None);
    let (mut aggregate_type, mut aggregate_id) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value =
            decode(value).ok_or_else(|| format!("{key}: not valid percent-encoded UTF-8"))?;
        match key {
            "projection" => projection = Some(value),
            "lsn" => {
                lsn = Some(
                    value
                        .parse::<Lsn>()
                        .map_err(|_| format!("lsn: {value:?} is not an LSN like 0/16B3748"))?,
                )
            }
            "timeout_ms" => {
                let ms: u64 = value.parse().map_err(|_| {
                    format!("timeout_ms: {value:?} is not a number of milliseconds")
                })?;
                timeout = Duration::from_millis(ms).min(MAX_TIMEOUT);
            }
            "source" => source = Some(value),
            "aggregate_type" => aggregate_type = Some(value),
            "aggregate_id" => aggregate_id = Some(value),
            other => return Err(format!("unknown parameter {other:?}")),
        }
    }
    let aggregate = match (aggregate_type, aggregate_id) {
        (Some(t), Some(id)) => Some((t, id)),
        (None, None) => None,
        _ => return Err("aggregate_type and aggregate_id go together".into()),
    };
    Ok(WaitRequest {
        projection: projection.ok_or("projection is missing")?,
        lsn: lsn
            .ok_or("lsn is missing (read pg_current_wal_lsn() on the source after the commit)")?,
        timeout,
        source,
        aggregate,
    })
}

/// `s` percent-decoded (`+` is a space).
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_its_parameters_decoded() {
        let r =
            parse("projection=order%20state&lsn=0%2F16B3748&timeout_ms=250&source=main").unwrap();
        assert_eq!(r.projection, "order state");
        assert_eq!(r.lsn.to_string(), "0/16B3748");
        assert_eq!(r.timeout, Duration::from_millis(250));
        assert_eq!(r.source.as_deref(), Some("main"));
        assert!(r.aggregate.is_none());
        let r = parse("projection=p&lsn=0/1&timeout_ms=999999").unwrap();
        assert_eq!(r.timeout, MAX_TIMEOUT, "capped");
    }

    #[test]
    fn a_bad_request_says_what_is_wrong() {
        assert!(parse("lsn=0/1").unwrap_err().contains("projection"));
        assert!(parse("projection=p").unwrap_err().contains("lsn"));
        assert!(parse("projection=p&lsn=zz").unwrap_err().contains("LSN"));
        assert!(parse("projection=p&lsn=0/1&aggregate_id=x")
            .unwrap_err()
            .contains("together"));
        assert!(parse("projection=p&lsn=0/1&color=red")
            .unwrap_err()
            .contains("color"));
    }
}
