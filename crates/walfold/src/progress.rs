//! Progress of long work (a backfill, a rebuild's replay) on standard error: a bar
//! (indicatif) on a terminal, and plain lines elsewhere (a log, CI, a pipe), one at
//! least every 2 seconds and one at the end, so nothing long runs silently.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often callers poll the work they follow (and so update the bar).
pub const POLL: Duration = Duration::from_millis(500);

/// Longest gap between two plain lines, less one poll: lines come at most 2 s apart.
const PLAIN_EVERY: Duration = Duration::from_millis(1500);

/// Where a snapshot of the work stands.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    /// Units done (rows read, events replayed).
    pub done: u64,
    /// Units still to do, when known (an estimate is fine).
    pub remaining: Option<u64>,
    /// Units per second; computed from `done` over the elapsed time when absent.
    pub rate: Option<f64>,
}

pub struct Progress {
    what: String,
    unit: &'static str,
    bar: Option<ProgressBar>,
    /// Whether the bar's style has a length (`None`: not styled yet).
    bounded: Option<bool>,
    started: Instant,
    last_line: Option<Instant>,
}

impl Progress {
    /// `what` names the work (`backfill of public.outbox`); `unit` its units (`rows`).
    pub fn new(what: impl Into<String>, unit: &'static str) -> Progress {
        let what = what.into();
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_prefix(what.clone());
            bar
        });
        let mut p = Progress {
            what,
            unit,
            bar,
            bounded: None,
            started: Instant::now(),
            last_line: None,
        };
        p.style(false);
        p
    }

    /// A bar with a length when the remaining work is known, a spinner otherwise.
    fn style(&mut self, bounded: bool) {
        let Some(bar) = &self.bar else { return };
        if self.bounded == Some(bounded) {
            return;
        }
        self.bounded = Some(bounded);
        let unit = self.unit;
        let template = if bounded {
            format!("{{prefix}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} {{msg}}")
        } else {
            format!("{{prefix}} [{{elapsed_precise}}] {{spinner}} {{pos}} {unit} {{msg}}")
        };
        bar.set_style(
            ProgressStyle::with_template(&template)
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
    }

    /// Shows `s`: redraws the bar, or prints a plain line when one is due.
    pub fn update(&mut self, s: Snapshot, extra: &str) {
        let line = self.describe(s, extra);
        self.style(s.remaining.is_some());
        match &self.bar {
            Some(bar) => {
                match s.remaining {
                    Some(r) => bar.set_length(s.done + r),
                    None => bar.unset_length(),
                }
                bar.set_position(s.done);
                bar.set_message(self.tail(s, extra));
            }
            None => {
                if self.last_line.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) {
                    eprintln!("{line}");
                    self.last_line = Some(Instant::now());
                }
            }
        }
    }

    /// The last word: the bar is cleared and `line` printed (always, terminal or not).
    pub fn finish(&mut self, s: Snapshot, extra: &str) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        eprintln!("{}", self.describe(s, extra));
    }

    fn rate(&self, s: Snapshot) -> f64 {
        s.rate.unwrap_or_else(|| {
            let secs = self.started.elapsed().as_secs_f64();
            if secs > 0.0 {
                s.done as f64 / secs
            } else {
                0.0
            }
        })
    }

    fn tail(&self, s: Snapshot, extra: &str) -> String {
        let rate = self.rate(s);
        let eta = match s.remaining {
            Some(0) => "0s".to_owned(),
            Some(r) if rate > 0.0 => format!("{:.0}s", r as f64 / rate),
            _ => "-".to_owned(),
        };
        let mut t = format!("{rate:.0} {}/s eta {eta}", self.unit);
        if !extra.is_empty() {
            t.push_str(", ");
            t.push_str(extra);
        }
        t
    }

    /// `backfill of public.outbox: 120000 rows, 880000 remaining (12%), 24000 rows/s, eta 37s`
    fn describe(&self, s: Snapshot, extra: &str) -> String {
        let rate = self.rate(s);
        let unit = self.unit;
        let mut line = format!("{}: {} {unit}", self.what, s.done);
        if let Some(r) = s.remaining {
            let total = s.done + r;
            let pct = if total > 0 {
                100.0 * s.done as f64 / total as f64
            } else {
                100.0
            };
            line.push_str(&format!(", {r} remaining ({pct:.0}%)"));
        }
        line.push_str(&format!(", {rate:.0} {unit}/s"));
        match s.remaining {
            Some(0) => line.push_str(", eta 0s"),
            Some(r) if rate > 0.0 => line.push_str(&format!(", eta {:.0}s", r as f64 / rate)),
            Some(_) => line.push_str(", eta -"),
            None => {}
        }
        line.push_str(&format!(
            ", {:.0}s elapsed",
            self.started.elapsed().as_secs_f64()
        ));
        if !extra.is_empty() {
            line.push_str(", ");
            line.push_str(extra);
        }
        line
    }
}
