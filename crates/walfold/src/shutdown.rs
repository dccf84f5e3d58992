//! One shutdown signal: SIGTERM or Ctrl-C cancels the token (drain); a second one, or
//! the deadline after the first, ends the process.

use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first signal; exits with code 1 on a second signal or when
/// draining takes longer than `deadline`.
pub fn install(token: CancellationToken, deadline: Duration) {
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!(
            deadline_s = deadline.as_secs(),
            "shutting down: finishing in-flight batches"
        );
        token.cancel();
        tokio::select! {
            _ = term.recv() => tracing::warn!("second signal: aborting"),
            _ = int.recv() => tracing::warn!("second signal: aborting"),
            _ = tokio::time::sleep(deadline) => tracing::warn!("shutdown deadline passed: aborting"),
        }
        std::process::exit(1);
    });
}
