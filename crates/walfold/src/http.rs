//! The metrics and health listener (hyper, HTTP/1.1): `/metrics` (Prometheus text),
//! `/healthz` (the process is up), `/readyz` (this instance leads, streams from the slot,
//! nothing is paused and every subscriber is within `metrics.ready_max_lag_s` of its
//! newest event).

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
use walfold_store::metrics::metrics;

/// Connections reused across scrapes; reopened after an error.
struct State {
    config: Config,
    clients: Mutex<Option<(Client, Client)>>,
}

/// Binds `addr` now (so a taken port fails at startup) and serves until `cancel`.
pub async fn start(
    config: Config,
    addr: SocketAddr,
    cancel: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    let state = Arc::new(State {
        config,
        clients: Mutex::new(None),
    });
    Ok(tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
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
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(handle(&state, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "metrics connection");
                }
            });
        }
    }))
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/metrics" => match scrape(state).await {
            Ok(body) => {
                let mut r = text(StatusCode::OK, body);
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                r
            }
            Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        },
        "/readyz" => match ready(state).await {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

/// Runs `f` with the (re)opened source and target connections.
async fn with_clients<T>(
    state: &State,
    f: impl AsyncFnOnce(&Client, &Client) -> Result<T, walfold_store::StoreError>,
) -> Result<T, walfold_store::StoreError> {
    let mut guard = state.clients.lock().await;
    if guard
        .as_ref()
        .is_none_or(|(s, t)| s.is_closed() || t.is_closed())
    {
        let source = walfold_store::connect(&state.config.source.url).await?;
        let target = walfold_store::connect(state.config.target_url()).await?;
        *guard = Some((source, target));
    }
    let (source, target) = guard.as_ref().expect("connected above");
    let result = f(source, target).await;
    if result.is_err() {
        *guard = None;
    }
    result
}

/// Process metrics always; the database gauges when the database answers in time.
async fn scrape(state: &State) -> Result<String, walfold_store::StoreError> {
    let (schema, slot) = (&state.config.target.schema, &state.config.source.slot);
    let refresh = with_clients(state, async |source, target| {
        metrics().refresh(source, target, schema, slot).await
    });
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

async fn ready(state: &State) -> Result<(), String> {
    let m = metrics();
    if !m.is_leader() {
        return Err("standby: another instance leads".into());
    }
    if !m.streaming() {
        return Err("not streaming from the slot".into());
    }
    if m.any_paused() {
        return Err(
            "paused by an error of the environment (see `walfold status` and the log)".into(),
        );
    }
    let (schema, slot) = (&state.config.target.schema, &state.config.source.slot);
    let check = with_clients(state, async |source, target| {
        let status = walfold_store::status(source, target, schema, slot).await?;
        let active = walfold_store::active_subscribers(target, schema).await?;
        Ok((status, active))
    });
    let (status, active) = tokio::time::timeout(DATABASE_TIMEOUT, check)
        .await
        .map_err(|_| "the database did not answer within 5 s".to_owned())?
        .map_err(|e| format!("cannot read status: {e}"))?;
    let limit = state.config.metrics.ready_max_lag_s as f64;
    // Only subscribers serving a projection now (not a replaced or replaying one).
    match status
        .subscribers
        .iter()
        .filter(|s| active.contains(&s.subscriber))
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
