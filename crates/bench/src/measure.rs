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

/// CPU seconds the server whose postmaster writes `data_dir/postmaster.pid` has used so
/// far: the postmaster's own and its exited children's, plus every live child's (its
/// backends, walsenders, checkpointer, autovacuum). Less disturbed by other load on the
/// machine than wall time.
pub fn server_cpu(data_dir: &std::path::Path) -> f64 {
    let ticks = 100.0; // CLK_TCK on Linux
    let field = |stat: &str, n: usize| -> u64 {
        // Fields after the command's closing parenthesis, numbered as in proc(5).
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(n - 3))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let Some(pm) = std::fs::read_to_string(data_dir.join("postmaster.pid"))
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
    else {
        return 0.0;
    };
    let mut total = 0u64;
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pm}/stat")) {
        total += field(&stat, 14) + field(&stat, 15) + field(&stat, 16) + field(&stat, 17);
    }
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if field(&stat, 4) == pm as u64 {
                total += field(&stat, 14) + field(&stat, 15);
            }
        }
    }
    total as f64 / ticks
}
