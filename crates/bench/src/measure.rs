//! Process measurements from /proc: CPU seconds (own and reaped children) and RSS.

use std::time::Instant;

/// CPU seconds of this process and of its waited-for children.
#[derive(Debug, Clone, Copy)]
pub struct Cpu {
    pub own: f64,
    pub children: f64,
}

pub fn cpu() -> Cpu {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may contain spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let tick = 100.0; // USER_HZ on Linux
    let get = |i: usize| f.get(i).copied().unwrap_or(0.0) / tick;
    // utime=14, stime=15, cutime=16, cstime=17 (1-based) → 11..14 after the name.
    Cpu {
        own: get(11) + get(12),
        children: get(13) + get(14),
    }
}

/// (current RSS, peak RSS) of this process, in MiB.
pub fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// A stopwatch with CPU accounting.
pub struct Span {
    start: Instant,
    cpu: Cpu,
}

impl Span {
    pub fn start() -> Span {
        Span {
            start: Instant::now(),
            cpu: cpu(),
        }
    }

    /// (wall seconds, own CPU seconds, children CPU seconds) since start.
    pub fn stop(&self) -> (f64, f64, f64) {
        let now = cpu();
        (
            self.start.elapsed().as_secs_f64(),
            now.own - self.cpu.own,
            now.children - self.cpu.children,
        )
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
