//! Runs walfold in your own binary with a Rust projection beside the TOML ones:
//!
//! ```text
//! cargo run -p walfold-examples --example account_balance -- walfold.toml
//! ```

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use walfold_config::{Config, ProjectionConfig};
use walfold_engine::Pipeline;
use walfold_examples::AccountBalance;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "walfold.toml".into());
    let config = Config::load(path.as_ref())?;
    let client = walfold_engine::connect(config.target_url()).await?;
    client.batch_execute(walfold_examples::DDL).await?;

    let mut options = ProjectionConfig::new("account_balance", "accounts.balance.v1");
    options.event_types = Some(vec!["AccountCredited".into(), "AccountDebited".into()]);
    options.parallelism = 2;
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    Pipeline::new(config)
        .with_projection(options, Arc::new(AccountBalance))
        .run(cancel)
        .await?;
    Ok(())
}
