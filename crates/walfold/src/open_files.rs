//! The daemon's open-file budget: every database connection, metrics client and log
//! file is a descriptor, and systemd's default soft limit (1024) is far below the hard
//! one. `walfold run` raises the soft limit to the hard one at start and says what it has.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; (soft before, soft now, hard).
pub fn raise() -> std::io::Result<(u64, u64, u64)> {
    let (before, hard) = rlimit::Resource::NOFILE.get()?;
    let now = rlimit::increase_nofile_limit(hard)?;
    Ok((before, now, hard))
}

/// [`raise`], logged: what the daemon may open, and a warning when that is little.
pub fn raise_and_log() {
    match raise() {
        Ok((before, now, hard)) => {
            if now > before {
                tracing::info!(
                    soft = now,
                    hard,
                    was = before,
                    "open files: raised the soft limit to the hard limit"
                );
            } else {
                tracing::info!(soft = now, hard, "open files: limit");
            }
            if now <= LOW {
                tracing::warn!(
                    soft = now,
                    "open files: the limit is low for a daemon; raise it (systemd: LimitNOFILE=)"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "open files: cannot read or raise the limit"),
    }
}

/// At or below this many descriptors a busy deployment (projections × parallelism, several
/// sources and targets, scrapes) can run out.
const LOW: u64 = 1024;

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let (_, now, hard) = super::raise().expect("read the limit");
        assert_eq!(now, hard);
        assert_eq!(rlimit::Resource::NOFILE.get().unwrap(), (hard, hard));
    }
}
