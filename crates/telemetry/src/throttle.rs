//! A bound on log lines of one kind: a producer's bad batch of 100k rows makes 100k
//! dead letters, and would make 100k log lines; the metrics count every one.

use std::time::{Duration, Instant};

/// Lets through at most `per_window` lines each `window`; what it holds back is counted
/// and said with the next line let through.
#[derive(Debug)]
pub struct Throttle {
    window: Duration,
    per_window: u32,
    started: Option<Instant>,
    said: u32,
    held: u64,
}

/// What to do with one line.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Write it; `held_back` lines were not written since the last one that was.
    Say { held_back: u64 },
    /// Write it, and say that the next ones this window are only counted.
    SayLast,
    /// Do not write it (counted).
    Hold,
}

impl Throttle {
    pub const fn new(window: Duration, per_window: u32) -> Self {
        Throttle {
            window,
            per_window,
            started: None,
            said: 0,
            held: 0,
        }
    }

    pub fn admit(&mut self) -> Admit {
        self.admit_at(Instant::now())
    }

    fn admit_at(&mut self, now: Instant) -> Admit {
        if self
            .started
            .is_none_or(|s| now.duration_since(s) >= self.window)
        {
            self.started = Some(now);
            self.said = 0;
        }
        if self.said >= self.per_window {
            self.held += 1;
            return Admit::Hold;
        }
        self.said += 1;
        if self.said == self.per_window {
            return Admit::SayLast;
        }
        Admit::Say {
            held_back: std::mem::take(&mut self.held),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_and_what_was_held_back_is_said_next_window() {
        let mut t = Throttle::new(Duration::from_secs(60), 3);
        let at = Instant::now();
        assert_eq!(t.admit_at(at), Admit::Say { held_back: 0 });
        assert_eq!(t.admit_at(at), Admit::Say { held_back: 0 });
        assert_eq!(t.admit_at(at), Admit::SayLast);
        for _ in 0..1000 {
            assert_eq!(t.admit_at(at + Duration::from_secs(1)), Admit::Hold);
        }
        assert_eq!(
            t.admit_at(at + Duration::from_secs(61)),
            Admit::Say { held_back: 1000 }
        );
        assert_eq!(
            t.admit_at(at + Duration::from_secs(62)),
            Admit::Say { held_back: 0 }
        );
    }
}
