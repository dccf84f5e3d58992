//! An extra target that cannot be reached: the projections this instance would run there
//! count as paused (once per subscriber, in `walfold_projection_paused` and `/readyz`),
//! and the cause is logged once per change, until the target answers again.

use walfold_telemetry::signal::Signal;

use crate::error::EngineError;

pub(crate) struct TargetDown {
    target: String,
    subscribers: Vec<String>,
    cause: Option<String>,
}

impl TargetDown {
    pub(crate) fn new(target: &str) -> TargetDown {
        TargetDown {
            target: target.to_owned(),
            subscribers: Vec::new(),
            cause: None,
        }
    }

    /// The subscribers that run there now: counted as paused while the target is down.
    pub(crate) fn serving(&mut self, subscribers: impl IntoIterator<Item = String>) {
        if self.cause.is_some() {
            return;
        }
        let mut all: Vec<String> = subscribers.into_iter().collect();
        all.sort();
        all.dedup();
        self.subscribers = all;
    }

    pub(crate) fn enter(&mut self, e: &EngineError) {
        let cause = e.to_string();
        if self.cause.is_none() {
            Signal::TargetPaused {
                subscribers: &self.subscribers,
            }
            .report();
        }
        if self.cause.as_deref() != Some(cause.as_str()) {
            Signal::TargetPauseCause {
                target: &self.target,
                subscribers: &self.subscribers,
                error: e,
            }
            .report();
            self.cause = Some(cause);
        }
    }

    pub(crate) fn leave(&mut self) {
        if self.cause.take().is_some() {
            Signal::TargetResumed {
                target: &self.target,
                subscribers: &self.subscribers,
            }
            .report();
        }
    }
}
