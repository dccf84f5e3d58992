//! What the process tells about itself: the metrics it exports, and the failpoints crash
//! tests arm. Depends on no other walfold crate, so every one can report.

pub mod failpoint;
pub mod metrics;
