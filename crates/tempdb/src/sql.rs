//! Talking to the server: connection URLs, psql and per-test databases.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{Cluster, Error, SUPERUSER};

/// libpq environment variables that would change where or how psql connects.
const CLEARED_ENV: &[&str] = &[
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGUSER",
    "PGDATABASE",
    "PGPASSWORD",
    "PGSERVICE",
    "PGOPTIONS",
    "PGSSLMODE",
    "PGTARGETSESSIONATTRS",
];

/// Longest identifier PostgreSQL keeps without truncating.
const MAX_IDENT: usize = 63;

impl Cluster {
    /// `postgresql://postgres@127.0.0.1:PORT/DB` (`db` is used as is, not percent-encoded).
    pub fn url(&self, db: &str) -> String {
        format!("postgresql://{SUPERUSER}@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates a database named `<prefix>_<counter>_<pid>` (prefix lowercased, other
    /// characters than `[a-z0-9_]` replaced by `_`) and returns the name.
    pub fn create_database(&self, prefix: &str) -> Result<String, Error> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = database_name(prefix, n, std::process::id());
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\";"))?;
        Ok(name)
    }

    /// Runs `sql` (one or more statements) with `psql -v ON_ERROR_STOP=1 -X -q -At` as
    /// `postgres` over TCP against `db`; returns psql's stdout unchanged (one row per line,
    /// columns separated by `|`, trailing newline included).
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, Error> {
        let mut cmd = Command::new(self.bin_dir.join("psql"));
        cmd.args([
            "-v",
            "ON_ERROR_STOP=1",
            "-X",
            "-q",
            "-At",
            "-h",
            "127.0.0.1",
        ])
        .args([
            "-p",
            &self.port.to_string(),
            "-U",
            SUPERUSER,
            "-d",
            db,
            "-f",
            "-",
        ])
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        for var in CLEARED_ENV {
            cmd.env_remove(var);
        }
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            program: "psql".into(),
            source,
        })?;
        let mut stdin = child.stdin.take();
        let sql = sql.as_bytes();
        // Feed stdin from a second thread so a large result cannot deadlock against it.
        let out = std::thread::scope(|s| {
            s.spawn(move || {
                if let Some(stdin) = stdin.as_mut() {
                    let _ = stdin.write_all(sql);
                }
                drop(stdin);
            });
            child.wait_with_output()
        })
        .map_err(|e| Error::io("waiting for psql", e))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Sql {
                db: db.to_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }
}

fn database_name(prefix: &str, n: u32, pid: u32) -> String {
    let suffix = format!("_{n}_{pid}");
    let mut clean: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        clean.push_str("db");
    }
    clean.truncate(MAX_IDENT - suffix.len());
    clean + &suffix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_safe_and_short() {
        assert_eq!(database_name("Orders-Test", 3, 42), "orders_test_3_42");
        assert_eq!(database_name("", 0, 1), "db_0_1");
        let long = database_name(&"x".repeat(100), 12, 4_000_000);
        assert_eq!(long.len(), MAX_IDENT);
        assert!(long.ends_with("_12_4000000"));
        assert_eq!(database_name("é", 1, 2), "__1_2");
    }
}
