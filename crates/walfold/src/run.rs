//! `walfold run` and `walfold migrate`.

use std::path::Path;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use walfold_config::Config;
use walfold_engine::{EngineError, Pipeline};

use crate::{shutdown, telemetry, Failure};

pub fn load(path: &Path) -> Result<Config, Failure> {
    Config::load(path).map_err(Failure::config)
}

/// Runs the daemon on the config at `path`; `runs`: the projections this instance runs,
/// from the command line (over `[cluster] projections`).
pub async fn run(path: &Path, runs: Option<Vec<String>>) -> Result<(), Failure> {
    let mut config = load(path)?;
    if runs.is_some() {
        config.cluster.projections = runs;
        config.validate().map_err(Failure::config)?;
    }
    telemetry::init(&config.log);
    crate::open_files::raise_and_log();
    for source in config.sources() {
        tracing::info!(source = %source.name, url = %walfold_config::redact_url(&source.url), slot = %source.slot, "following source");
    }
    tracing::info!(
        sources = config.sources().len(),
        projections = config.projection.len(),
        "walfold starting"
    );
    walfold_telemetry::stall::set_threshold(std::time::Duration::from_secs(
        config.metrics.ready_max_stall_s,
    ));
    let cancel = CancellationToken::new();
    // The listener outlives the pipeline's drain, so /healthz answers until the end.
    let listener = CancellationToken::new();
    let _stop_listener = listener.clone().drop_guard();
    if let Some(listen) = &config.metrics.listen {
        let addr = listen.parse().map_err(Failure::config)?;
        crate::http::start(config.clone(), addr, listener.clone())
            .await
            .map_err(|e| {
                Failure::runtime(format!("cannot listen on {listen} (metrics.listen): {e}"))
            })?;
    }
    shutdown::install(
        cancel.clone(),
        Duration::from_secs(config.pipeline.shutdown_timeout_s),
    );
    match Pipeline::new(config).run(cancel).await {
        Ok(()) => {
            tracing::info!("walfold stopped cleanly");
            Ok(())
        }
        Err(e) => Err(failure(e)),
    }
}

pub async fn migrate_only(path: &Path) -> Result<(), Failure> {
    let config = load(path)?;
    telemetry::init(&config.log);
    for t in walfold_engine::Target::all(&config) {
        walfold_store::migrate(&t.url, &t.schema)
            .await
            .map_err(|e| match e {
                e if e.is_usage() => Failure::config(format!("target {}: {e}", t.label())),
                e => Failure::runtime(format!("target {}: {e}", t.label())),
            })?;
        if t.is_extra() {
            println!(
                "schema {} on target {} is up to date",
                t.schema.name(),
                t.label()
            );
        } else {
            println!("schema {} is up to date", t.schema.name());
        }
    }
    Ok(())
}

/// What stopped the daemon, logged with its kind (a definite error carries its fix); the
/// exit code follows from it (see [`crate::engine_failure`]).
fn failure(e: EngineError) -> Failure {
    tracing::error!(kind = ?e.kind(), error = %e, "walfold stopped");
    crate::engine_failure(e)
}
