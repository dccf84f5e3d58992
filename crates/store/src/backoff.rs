//! The one backoff every retrying loop uses: exponential from `initial` to `cap`, with
//! jitter (so instances that failed together do not retry together), reset after a
//! success.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    cap: Duration,
    next: Duration,
    jitter: bool,
}

impl Backoff {
    /// Waits of `initial`, `2 × initial`, … up to `cap`, each scaled by a random factor
    /// in [0.5, 1).
    pub fn new(initial: Duration, cap: Duration) -> Backoff {
        Backoff {
            initial,
            cap: cap.max(initial),
            next: initial,
            jitter: true,
        }
    }

    /// The same without jitter (a projection's per-event retry delays, which operators
    /// read in `retry_backoff_ms`).
    pub fn exact(initial: Duration, cap: Duration) -> Backoff {
        Backoff {
            jitter: false,
            ..Backoff::new(initial, cap)
        }
    }

    /// The wait before the next attempt; doubles the one after it.
    pub fn next_wait(&mut self) -> Duration {
        let wait = if self.jitter {
            self.next.mul_f64(rand::rng().random_range(0.5..1.0))
        } else {
            self.next
        };
        self.next = (self.next * 2).min(self.cap);
        wait
    }

    /// After a success: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }

    /// Sleeps the next wait; false when `cancel` fired first.
    pub async fn sleep(&mut self, cancel: &tokio_util::sync::CancellationToken) -> bool {
        let wait = self.next_wait();
        tokio::select! {
            biased;
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::exact(ms(100), ms(350));
        let waits: Vec<_> = (0..4).map(|_| b.next_wait()).collect();
        assert_eq!(waits, [ms(100), ms(200), ms(350), ms(350)]);
        b.reset();
        assert_eq!(b.next_wait(), ms(100));
        let mut j = Backoff::new(ms(100), ms(1000));
        let w = j.next_wait();
        assert!(w >= ms(50) && w < ms(100), "{w:?}");
    }
}
