//! The error type of this crate.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while managing a throwaway cluster.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No directory with PostgreSQL server binaries was found.
    BinariesNotFound {
        /// Places that were looked at.
        searched: Vec<PathBuf>,
    },
    /// `WALFOLD_PG_BINDIR` is set but holds no `initdb`.
    BadBinDir {
        /// The configured directory.
        dir: PathBuf,
    },
    /// Running as root, but there is no `postgres` OS user to run the server as.
    NoPostgresUser,
    /// A helper program could not be started.
    Spawn {
        /// The program.
        program: String,
        /// Why it could not be started.
        source: io::Error,
    },
    /// A helper program ran and failed.
    Command {
        /// The program.
        program: String,
        /// Its exit status.
        status: String,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// A filesystem operation failed.
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The server failed to start, stop or become ready.
    Server {
        /// What was being done: "start", "stop", "restart".
        action: String,
        /// What went wrong.
        reason: String,
        /// The last lines of the server log.
        log_tail: String,
    },
    /// psql failed (connection or SQL error).
    Sql {
        /// The database.
        db: String,
        /// What psql wrote to stderr.
        stderr: String,
    },
    /// An unknown shutdown mode was requested.
    InvalidMode(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BinariesNotFound { searched } => {
                let places: Vec<String> =
                    searched.iter().map(|p| p.display().to_string()).collect();
                write!(
                    f,
                    "postgresql binaries not found (looked in {}): install postgresql \
                     (apt-get install postgresql) or set WALFOLD_PG_BINDIR",
                    places.join(", ")
                )
            }
            Error::BadBinDir { dir } => write!(
                f,
                "no initdb in WALFOLD_PG_BINDIR ({}): point it at the directory holding \
                 initdb, pg_ctl and postgres, or unset it",
                dir.display()
            ),
            Error::NoPostgresUser => f.write_str(
                "running as root but there is no `postgres` os user to run the server as: \
                 install postgresql (it creates the user) or run as a non-root user",
            ),
            Error::Spawn { program, source } => {
                write!(f, "could not run {program}: {source}")?;
                if source.kind() == io::ErrorKind::NotFound {
                    write!(f, " (install it or put it on PATH)")?;
                }
                Ok(())
            }
            Error::Command {
                program,
                status,
                stderr,
            } => write!(f, "{program} failed ({status}): {}", stderr.trim()),
            Error::Io { context, source } => write!(f, "{context}: {source}"),
            Error::Server {
                action,
                reason,
                log_tail,
            } => {
                write!(f, "postgresql server {action} failed: {reason}")?;
                if !log_tail.trim().is_empty() {
                    write!(f, "\nserver log tail:\n{}", log_tail.trim_end())?;
                }
                Ok(())
            }
            Error::Sql { db, stderr } => {
                write!(f, "psql on database {db:?} failed: {}", stderr.trim())
            }
            Error::InvalidMode(mode) => write!(
                f,
                "invalid shutdown mode {mode:?}: use \"smart\", \"fast\" or \"immediate\""
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Spawn { source, .. } | Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lowercase_and_carry_the_fix() {
        let e = Error::BinariesNotFound {
            searched: vec![PathBuf::from("/usr/lib/postgresql/*/bin")],
        };
        let msg = e.to_string();
        assert!(msg.starts_with("postgresql binaries not found"), "{msg}");
        assert!(msg.contains("apt-get install postgresql"), "{msg}");
        assert!(msg.contains("WALFOLD_PG_BINDIR"), "{msg}");
        let e = Error::Spawn {
            program: "openssl".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert!(e.to_string().contains("install it"));
        assert!(std::error::Error::source(&e).is_some());
        let e = Error::InvalidMode("slow".into());
        assert!(e.to_string().starts_with("invalid shutdown mode \"slow\""));
    }

    #[test]
    fn server_error_includes_log_tail() {
        let e = Error::Server {
            action: "start".into(),
            reason: "pg_ctl failed".into(),
            log_tail: "FATAL:  boom\n".into(),
        };
        assert_eq!(
            e.to_string(),
            "postgresql server start failed: pg_ctl failed\nserver log tail:\nFATAL:  boom"
        );
    }
}
