//! Running the server binaries as the right OS user (`postgres` when we are root).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bins::find_in_path;
use crate::exec::run;
use crate::Error;

const OS_USER: &str = "postgres";

/// Who runs initdb, pg_ctl and postgres.
#[derive(Debug, Clone)]
pub(crate) enum RunAs {
    /// The current user (not root).
    Current,
    /// Root: switch to the `postgres` OS user with runuser.
    Postgres { runuser: PathBuf },
}

impl RunAs {
    /// The current user, or the `postgres` OS user when running as root.
    pub(crate) fn detect() -> Result<Self, Error> {
        if !is_root() {
            return Ok(RunAs::Current);
        }
        let exists = Command::new("id")
            .args(["-u", OS_USER])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !exists {
            return Err(Error::NoPostgresUser);
        }
        let runuser = find_in_path("runuser")
            .or_else(|| Some(PathBuf::from("/usr/sbin/runuser")).filter(|p| p.is_file()))
            .unwrap_or_else(|| PathBuf::from("runuser"));
        Ok(RunAs::Postgres { runuser })
    }

    pub(crate) fn switches_user(&self) -> bool {
        matches!(self, RunAs::Postgres { .. })
    }

    /// The argv prefix that makes a command run as the right user (empty for [`RunAs::Current`]).
    pub(crate) fn prefix(&self) -> Vec<OsString> {
        match self {
            RunAs::Current => Vec::new(),
            RunAs::Postgres { runuser } => vec![
                runuser.clone().into_os_string(),
                "-u".into(),
                OS_USER.into(),
                "--".into(),
            ],
        }
    }

    /// A command running `program` as the right user.
    pub(crate) fn command(&self, program: &Path) -> Command {
        let mut argv = self.prefix();
        argv.push(program.as_os_str().to_owned());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd
    }

    /// Gives `path` (recursively) to the server's OS user; a no-op for [`RunAs::Current`].
    pub(crate) fn chown(&self, path: &Path) -> Result<(), Error> {
        if self.switches_user() {
            let owner = format!("{OS_USER}:");
            run(
                Command::new("chown").arg("-R").arg(owner).arg(path),
                "chown",
            )?;
        }
        Ok(())
    }
}

/// Whether the effective uid is 0, from /proc/self/status, falling back to `id -u`.
pub(crate) fn is_root() -> bool {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(uid) = effective_uid(&status) {
            return uid == 0;
        }
    }
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_effective_uid() {
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t1\t1\t1\t1\n";
        assert_eq!(effective_uid(status), Some(0));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn postgres_prefix_uses_runuser() {
        let run_as = RunAs::Postgres {
            runuser: PathBuf::from("/usr/sbin/runuser"),
        };
        let cmd = run_as.command(Path::new("/bin/pg_ctl"));
        assert_eq!(cmd.get_program(), "/usr/sbin/runuser");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args, ["-u", "postgres", "--", "/bin/pg_ctl"]);
        assert!(RunAs::Current.prefix().is_empty());
    }
}
