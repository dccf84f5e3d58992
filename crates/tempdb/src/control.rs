//! Starting, stopping and restarting the server with pg_ctl, and waiting until it is ready.

use std::path::PathBuf;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::exec::run;
use crate::{Cluster, Error, SUPERUSER};

/// Bound on every start, stop and readiness wait.
const TIMEOUT: Duration = Duration::from_secs(30);
const LOG_TAIL_LINES: usize = 30;

impl Cluster {
    /// Restarts the server (`pg_ctl restart -m MODE`, MODE is "smart", "fast" or "immediate")
    /// and waits until it accepts connections.
    pub fn restart(&self, mode: &str) -> Result<(), Error> {
        check_mode(mode)?;
        self.pg_ctl("restart", Some(mode))?;
        self.wait_ready("restart")
    }

    /// Stops the server (`pg_ctl stop -m MODE`); [`Cluster::start_again`] brings it back.
    pub fn stop(&self, mode: &str) -> Result<(), Error> {
        check_mode(mode)?;
        self.pg_ctl("stop", Some(mode))
    }

    /// Starts the server again after [`Cluster::stop`], on the same port, and waits until it
    /// accepts connections.
    pub fn start_again(&self) -> Result<(), Error> {
        self.pg_ctl("start", None)?;
        self.wait_ready("start")
    }

    /// The server log (log_min_messages=warning).
    pub fn log_file(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The postmaster's pid, from `postmaster.pid`, while the server runs.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Runs `pg_ctl ACTION` and waits for it (bounded by [`TIMEOUT`]).
    pub(crate) fn pg_ctl(&self, action: &str, mode: Option<&str>) -> Result<(), Error> {
        let mut cmd = self.run_as.command(&self.bin_dir.join("pg_ctl"));
        cmd.current_dir(&self.dir)
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(self.log_file())
            .args(["-w", "-t", &TIMEOUT.as_secs().to_string(), "-s"]);
        if let Some(mode) = mode {
            cmd.args(["-m", mode]);
        }
        cmd.arg(action);
        run(&mut cmd, "pg_ctl")
            .map(drop)
            .map_err(|e| Error::Server {
                action: action.to_owned(),
                reason: e.to_string(),
                log_tail: self.log_tail(),
            })
    }

    /// Polls pg_isready until the server accepts connections, for at most [`TIMEOUT`].
    pub(crate) fn wait_ready(&self, action: &str) -> Result<(), Error> {
        let deadline = Instant::now() + TIMEOUT;
        let port = self.port.to_string();
        loop {
            let ready = Command::new(self.bin_dir.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", SUPERUSER])
                .args(["-d", "postgres", "-t", "5"])
                .status();
            match ready {
                Ok(status) if status.success() => return Ok(()),
                Err(source) => {
                    return Err(Error::Spawn {
                        program: "pg_isready".into(),
                        source,
                    })
                }
                Ok(_) if Instant::now() >= deadline => {
                    return Err(Error::Server {
                        action: action.to_owned(),
                        reason: format!(
                            "not accepting connections on 127.0.0.1:{port} after {} s",
                            TIMEOUT.as_secs()
                        ),
                        log_tail: self.log_tail(),
                    })
                }
                Ok(_) => sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The last lines of the server log, or "" if it cannot be read.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read(self.log_file()).unwrap_or_default();
        tail(&String::from_utf8_lossy(&text), LOG_TAIL_LINES)
    }

    pub(crate) fn log_len(&self) -> u64 {
        std::fs::metadata(self.log_file()).map_or(0, |m| m.len())
    }

    /// Whether the log, from byte `offset` on, says the port was already taken.
    pub(crate) fn port_clash_since(&self, offset: u64) -> bool {
        let text = std::fs::read(self.log_file()).unwrap_or_default();
        let start = usize::try_from(offset).unwrap_or(0).min(text.len());
        let new = String::from_utf8_lossy(&text[start..]);
        new.contains("Address already in use") || new.contains("could not bind")
    }
}

fn check_mode(mode: &str) -> Result<(), Error> {
    match mode {
        "smart" | "fast" | "immediate" => Ok(()),
        other => Err(Error::InvalidMode(other.to_owned())),
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_checked() {
        assert!(check_mode("fast").is_ok());
        assert!(check_mode("immediate").is_ok());
        assert!(matches!(check_mode("now"), Err(Error::InvalidMode(_))));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 5), "");
    }
}
