//! What the process tells about itself: the signals it reports as it works (each moves
//! metrics and writes its log line), the metrics it exports, the work it holds and
//! whether that moves (`stall`), and the failpoints crash tests arm. Depends on no other walfold crate, so every one can report.

pub mod failpoint;
pub mod metrics;
pub mod signal;
pub mod stall;
pub mod throttle;
