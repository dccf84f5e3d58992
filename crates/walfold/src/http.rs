//! The metrics and health listener (hyper, HTTP/1.1): `/metrics` (Prometheus text),
//! `/healthz` (the process is up), `/readyz` (this instance holds work, streams from the
//! slot, no source's ingest stopped and no extra target is down (each named with why),
//! nothing of it is paused or stalled (`walfold_telemetry::stall`) and every subscriber
//! is within `metrics.ready_max_lag_s` of its newest event). The database gauges and the lag check include the projections on
//! extra targets (`[targets.NAME]`); `/wait` (read your own writes, `wait.rs`). It serves at most 64 connections at once and
//! closes one after 20 s (5 s to send its headers), so no client can take the daemon's
//! file descriptors or hold its tasks.

use std::borrow::Borrow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Mutex;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use walfold_config::Config;
use walfold_store::operator::{SourceProbe, TargetStatus};
use walfold_store::Operator;
use walfold_telemetry::metrics::metrics;

/// Connections reused across scrapes; reopened after an error.
struct State {
    config: Config,
    clients: Mutex<Clients>,
    /// Connections of `/wait` requests (read your own writes).
    waits: crate::wait::Waits,
}

/// Connections kept between requests: the target's, and one per source (`None` until
/// it connects, or after it failed).
#[derive(Default)]
struct Clients {
    target: Option<Client>,
    sources: Vec<Option<Client>>,
}

/// Binds `addr` now (so a taken port fails at startup) and serves until `cancel`.
pub async fn start(
    config: Config,
    addr: SocketAddr,
    cancel: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz and /wait");
    let state = Arc::new(State {
        config,
        clients: Mutex::new(Clients::default()),
        waits: crate::wait::Waits::default(),
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    Ok(tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = cancel.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics listener accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            // Over the cap the connection is closed at once: its descriptor is the
            // daemon's, and replication needs them more than a scraper does.
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "metrics listener: too many connections, closing one");
                drop(stream);
                continue;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(handle(&state, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                    Ok(Err(e)) => tracing::debug!(error = %e, "metrics connection"),
                    Err(_) => tracing::debug!(%peer, "metrics connection: open too long, closed"),
                    Ok(Ok(())) => {}
                }
            });
        }
    }))
}

/// Connections the listener serves at once; more are closed as they arrive.
const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may stay open, whatever it does (a scrape takes at most the
/// database timeout).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(20);

async fn handle(state: &State, req: Request<Incoming>) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/metrics" => match scrape(state).await {
            Ok(body) => {
                // OpenMetrics for whoever asks for it (Prometheus does); the classic text
                // format for everyone else (curl, `promtool check metrics`, older agents).
                let openmetrics = req
                    .headers()
                    .get(hyper::header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("application/openmetrics-text"));
                let (body, content_type) = if openmetrics {
                    (
                        body,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )
                } else {
                    (
                        classic_text(&body),
                        "text/plain; version=0.0.4; charset=utf-8",
                    )
                };
                let mut r = text(StatusCode::OK, body);
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(content_type),
                );
                r
            }
            Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        },
        "/readyz" => match ready(state).await {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        "/wait" => {
            let (code, body) =
                crate::wait::answer(&state.config, &state.waits, req.uri().query().unwrap_or(""))
                    .await;
            let mut r = text(code, body);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// OpenMetrics text as the classic Prometheus text format (0.0.4): a counter family is
/// named like its samples (`x_total`, where OpenMetrics names it `x`), and there is no
/// `# EOF` or `# UNIT`. Samples are the same in both.
fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 64 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(l.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

/// Runs `f` with the (re)opened target connection and every source that answers: a
/// source that is down is reported as such, never an error of the whole request.
async fn with_clients<T>(
    state: &State,
    f: impl AsyncFnOnce(&[SourceProbe<'_>], &Client) -> Result<T, walfold_store::StoreError>,
) -> Result<T, walfold_store::StoreError> {
    let mut guard = state.clients.lock().await;
    let clients = &mut *guard;
    if clients.target.as_ref().is_none_or(Client::is_closed) {
        clients.target = None;
        clients.target = Some(
            walfold_pg::connect_within(state.config.target_url(), "target main", CONNECT_TIMEOUT)
                .await?,
        );
    }
    let sources = state.config.sources();
    clients.sources.resize_with(sources.len(), || None);
    let mut errors = Vec::with_capacity(sources.len());
    for (source, client) in sources.iter().zip(clients.sources.iter_mut()) {
        let mut error = None;
        if client.as_ref().is_none_or(Client::is_closed) {
            let server = format!("source {}", source.name);
            match walfold_pg::connect_within(&source.url, &server, CONNECT_TIMEOUT).await {
                Ok(c) => *client = Some(c),
                Err(e) => {
                    *client = None;
                    error = Some(e.to_string());
                }
            }
        }
        errors.push(error);
    }
    let probes: Vec<SourceProbe<'_>> = sources
        .iter()
        .zip(&clients.sources)
        .zip(errors)
        .map(|((source, client), error)| SourceProbe {
            name: &source.name,
            slot: &source.slot,
            client: match (client, error) {
                (Some(c), None) => Ok(c),
                (_, e) => Err(e.unwrap_or_default()),
            },
        })
        .collect();
    let target = clients.target.as_ref().expect("connected above");
    let result = f(&probes, target).await;
    drop(probes);
    if result.is_err() {
        *clients = Clients::default();
    }
    result
}

/// Process metrics always; the database gauges when the database answers in time.
async fn scrape(state: &State) -> Result<String, walfold_store::StoreError> {
    let schema = &walfold_engine::Target::main(&state.config).schema;
    let refresh = async {
        let unreachable = with_clients(state, async |sources, target| {
            // Before the first migration has finished there is nothing to read yet: the
            // gauges stay absent, silently (a scrape racing a first start is no fault).
            if !walfold_store::schema_current(target, schema).await? {
                tracing::debug!("metrics: walfold's schema is not migrated yet");
                return Ok(Vec::new());
            }
            let log = Operator::new(target, schema);
            let (extra, active) = every_target(&state.config, &log).await?;
            let reading = log.metrics_reading(sources, extra, &active).await?;
            metrics().set_database(&reading);
            metrics().set_event_log_rows(log.event_log_estimate().await?);
            Ok(reading
                .sources
                .iter()
                .map(|s| s.slot.is_none())
                .collect::<Vec<bool>>())
        })
        .await?;
        // A source that did not answer gets a fresh connection next time (the old one
        // may sit in a partition for minutes before the kernel gives up on it).
        let mut clients = state.clients.lock().await;
        for (client, down) in clients.sources.iter_mut().zip(unreachable) {
            if down {
                *client = None;
            }
        }
        Ok(())
    };
    let database = tokio::time::timeout(DATABASE_TIMEOUT, refresh)
        .await
        .unwrap_or_else(|_| {
            Err(walfold_store::StoreError::Busy(
                "the database did not answer within 5 s".into(),
            ))
        });
    Ok(metrics().render(database))
}

/// How long a scrape or readiness check waits for the database.
const DATABASE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a scrape waits for a connection to a server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long it waits for each extra target.
const EXTRA_TARGET_TIMEOUT: Duration = Duration::from_secs(2);

/// The subscribers serving a projection now on the target `label`, as (target,
/// subscriber): the registry's, for the projections the config puts on that target (a
/// projection moved to another target leaves its old registry row behind).
async fn serving(
    config: &Config,
    label: &str,
    target: &Operator<impl Borrow<Client>>,
) -> Result<Vec<(String, String)>, walfold_store::StoreError> {
    Ok(target
        .active_projections()
        .await?
        .into_iter()
        .filter(|(name, _)| {
            config
                .projection
                .iter()
                .any(|p| p.name == *name && walfold_engine::Target::of(config, p).label() == label)
        })
        .map(|(_, subscriber)| (label.to_owned(), subscriber))
        .collect())
}

/// The extra targets' parts of the status, and the (target, subscriber) pairs serving a
/// projection now on every target, the main one (`log`) included.
async fn every_target(
    config: &Config,
    log: &Operator<&Client>,
) -> Result<(Vec<TargetStatus>, Vec<(String, String)>), walfold_store::StoreError> {
    let mut active = serving(config, "main", log).await?;
    let (parts, more) = extra_parts(config, log).await;
    active.extend(more);
    Ok((parts, active))
}

/// The extra targets' parts of the status and their active subscribers, each read on a
/// fresh connection. A target that does not answer in time is left out: its
/// projections already count as paused (`walfold_projection_paused`).
async fn extra_parts(
    config: &Config,
    log: &Operator<&Client>,
) -> (Vec<TargetStatus>, Vec<(String, String)>) {
    let mut parts = Vec::new();
    let mut active = Vec::new();
    for t in walfold_engine::Target::all(config)
        .into_iter()
        .filter(walfold_engine::Target::is_extra)
    {
        let read = async {
            let extra = Operator::connect(&t.url, &t.schema).await?;
            let part = log.target_status(&extra, t.label()).await?;
            let subscribers = serving(config, t.label(), &extra).await?;
            Ok::<_, walfold_store::StoreError>((part, subscribers))
        };
        match tokio::time::timeout(EXTRA_TARGET_TIMEOUT, read).await {
            Ok(Ok((part, subscribers))) => {
                parts.push(part);
                active.extend(subscribers);
            }
            Ok(Err(e)) => {
                tracing::debug!(target = t.label(), error = %e, "metrics: cannot read an extra target")
            }
            Err(_) => tracing::debug!(
                target = t.label(),
                "metrics: an extra target did not answer in time"
            ),
        }
    }
    (parts, active)
}

async fn ready(state: &State) -> Result<(), String> {
    let m = metrics();
    if !m.is_leader() && m.units_owned() == 0 {
        // Holding no work: the target says whether that is its choice or an outage.
        let target = walfold_engine::Target::main(&state.config);
        let server = format!("target {}", target.label());
        return Err(
            match walfold_pg::connect_within(&target.url, &server, DATABASE_TIMEOUT).await {
                Ok(_) => "standby: this instance holds no work (the others run every unit, or it is taking some over)".into(),
                Err(e) => format!("not leading and holding no work: {e} (retried with backoff)"),
            },
        );
    }
    // A part that stopped or pauses on its own (a source's ingest on a definite error,
    // an extra target that cannot be used), named with why: the rest goes on.
    let held = m.held();
    if !held.is_empty() {
        let parts: Vec<String> = held
            .iter()
            .map(|(part, cause)| format!("{part}: {cause}"))
            .collect();
        return Err(parts.join("; "));
    }
    let names: Vec<&str> = state
        .config
        .sources()
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    let idle = match m.is_leader() {
        true => m.not_streaming(&names),
        false => Vec::new(),
    };
    if state.config.sources().len() == 1 && !idle.is_empty() {
        return Err("not streaming from the slot".into());
    }
    if !idle.is_empty() {
        return Err(format!(
            "not streaming from the slot of source {}",
            idle.join(", ")
        ));
    }
    if m.any_paused() {
        return Err(
            "paused by an error of the environment (see `walfold status` and the log)".into(),
        );
    }
    let stalled = walfold_telemetry::stall::stalled();
    if !stalled.is_empty() {
        let mut why = format!(
            "no progress: {}",
            stalled
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        );
        // The usual cause, named: a lock that walfold's sessions wait for on the target.
        let waits = with_clients(state, async |_, target| {
            walfold_store::lock_waits(target).await
        });
        if let Ok(Ok(waits)) = tokio::time::timeout(DATABASE_TIMEOUT, waits).await {
            if !waits.is_empty() {
                why.push_str("; walfold's sessions waiting for a lock on the target: ");
                why.push_str(&waits.join("; "));
            }
        }
        return Err(why);
    }
    let schema = &walfold_engine::Target::main(&state.config).schema;
    let check = with_clients(state, async |sources, target| {
        if !walfold_store::schema_current(target, schema).await? {
            return Ok(None);
        }
        let log = Operator::new(target, schema);
        let mut status = log.status(sources).await?;
        let (parts, active) = every_target(&state.config, &log).await?;
        for part in parts {
            status.add(part);
        }
        Ok(Some((status, active)))
    });
    let (status, active) = tokio::time::timeout(DATABASE_TIMEOUT, check)
        .await
        .map_err(|_| "the database did not answer within 5 s".to_owned())?
        .map_err(|e| format!("cannot read status: {e}"))?
        .ok_or("walfold's schema is not migrated yet (a first start or an upgrade creates it)")?;
    let limit = state.config.metrics.ready_max_lag_s as f64;
    // Only subscribers serving a projection now (not a replaced or replaying one).
    match status
        .subscribers
        .iter()
        .filter(|s| {
            active
                .iter()
                .any(|(t, sub)| *t == s.target && *sub == s.subscriber)
        })
        .find(|s| s.lag_seconds.is_some_and(|l| l > limit))
    {
        Some(s) => Err(format!(
            "subscriber {} is {:.0}s behind (limit {limit:.0}s)",
            s.subscriber,
            s.lag_seconds.unwrap_or(0.0)
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::classic_text;

    #[test]
    fn counters_take_their_samples_name_in_the_classic_format() {
        let om = "# HELP walfold_applied Events that changed a read model.\n\
                  # TYPE walfold_applied counter\n\
                  walfold_applied_total{subscriber=\"a\"} 3\n\
                  # HELP walfold_leader 1 while this instance leads.\n\
                  # TYPE walfold_leader gauge\n\
                  walfold_leader 1\n\
                  # EOF\n";
        assert_eq!(
            classic_text(om),
            "# HELP walfold_applied_total Events that changed a read model.\n\
             # TYPE walfold_applied_total counter\n\
             walfold_applied_total{subscriber=\"a\"} 3\n\
             # HELP walfold_leader 1 while this instance leads.\n\
             # TYPE walfold_leader gauge\n\
             walfold_leader 1\n"
        );
    }
}
