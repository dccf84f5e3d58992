//! Fault injection for crash tests (feature `failpoints`, never in release builds):
//! `WALFOLD_FAILPOINTS=after_append_commit=3,after_projection_commit=5` aborts the
//! process the Nth time the named point is passed; `leader_watch=sleep:8000` makes a
//! [`delay`] point wait 8 s each time it is passed, `append=stall:8000` only the first
//! time.

/// Aborts the process if `name` is armed and this is its Nth pass.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static COUNTS: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);
    let Ok(spec) = std::env::var("WALFOLD_FAILPOINTS") else {
        return;
    };
    let Some(limit) = spec.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == name).then(|| v.trim().parse::<u64>().ok())?
    }) else {
        return;
    };
    let mut guard = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    let count = guard
        .get_or_insert_with(HashMap::new)
        .entry(name.to_owned())
        .or_insert(0);
    *count += 1;
    if *count >= limit {
        eprintln!("failpoint {name} hit after {count} passes: aborting");
        std::process::abort();
    }
}

/// Waits if `name` is armed with `sleep:MS`.
#[cfg(feature = "failpoints")]
pub async fn delay(name: &str) {
    let Ok(spec) = std::env::var("WALFOLD_FAILPOINTS") else {
        return;
    };
    use std::sync::Mutex;
    static STALLED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let Some(v) = spec.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == name).then(|| v.trim().to_owned())
    }) else {
        return;
    };
    let ms = if let Some(ms) = v.strip_prefix("sleep:") {
        ms.parse::<u64>().ok()
    } else if let Some(ms) = v.strip_prefix("stall:") {
        let mut stalled = STALLED.lock().unwrap_or_else(|e| e.into_inner());
        if stalled.iter().any(|n| n == name) {
            None
        } else {
            stalled.push(name.to_owned());
            ms.parse::<u64>().ok()
        }
    } else {
        None
    };
    if let Some(ms) = ms {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

/// Without the feature, failpoints compile to nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// Without the feature, failpoints compile to nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn delay(_name: &str) {}
