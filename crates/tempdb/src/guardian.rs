//! A guardian process that stops the server and removes its directory once the owner is gone.
//!
//! The guardian is `sh` blocked reading its stdin, a pipe whose write end only the owning
//! process holds (std opens pipes close-on-exec, so no other child inherits it). When the
//! owner drops the [`Guardian`] or dies for any reason, even SIGKILL, the pipe closes, and the
//! guardian runs `pg_ctl stop -m immediate` and `rm -rf` on the cluster directory. It runs in
//! its own session (`setsid`), or at least its own process group, and ignores INT/HUP/TERM,
//! so Ctrl-C on the tests does not kill it before it has cleaned up.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::bins::find_in_path;
use crate::Error;

const SCRIPT: &str = "trap '' INT HUP TERM QUIT PIPE
dir=$1
shift
cat >/dev/null 2>&1
\"$@\" >/dev/null 2>&1
rm -rf \"$dir\"
";

/// The running guardian; keep it alive as long as the cluster should live.
#[derive(Debug)]
pub(crate) struct Guardian {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Guardian {
    /// Starts a guardian that runs `stop` (argv) and then removes `dir`.
    pub(crate) fn spawn(dir: &Path, stop: &[OsString]) -> Result<Self, Error> {
        let mut cmd = match find_in_path("setsid") {
            Some(setsid) => {
                let mut cmd = Command::new(setsid);
                cmd.arg("sh");
                cmd
            }
            None => {
                let mut cmd = Command::new("sh");
                cmd.process_group(0);
                cmd
            }
        };
        cmd.args(["-c", SCRIPT, "walfold-tempdb-guardian"])
            .arg(dir)
            .args(stop)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            program: "sh (cluster guardian)".into(),
            source,
        })?;
        let stdin = child.stdin.take();
        Ok(Guardian { child, stdin })
    }

    /// Lets the guardian do its cleanup now and waits for it to finish.
    pub(crate) fn release(mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn cleans_up_when_released() {
        let dir = std::env::temp_dir().join(format!("walfold-guard-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let marker = dir.with_extension("marker");
        let stop: Vec<OsString> = vec!["touch".into(), marker.clone().into()];
        let guardian = Guardian::spawn(&dir, &stop).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(dir.exists(), "guardian must wait for the owner");
        let started = Instant::now();
        guardian.release();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!dir.exists());
        assert!(marker.exists());
        std::fs::remove_file(marker).unwrap();
    }
}
