//! Throwaway PostgreSQL clusters for walfold's test suites and the `walfold demo` command.
//!
//! [`Cluster::start`] runs `initdb` into a fresh temporary directory, configures the server for
//! logical replication on a free loopback port and starts it. The cluster is stopped and its
//! directory removed when the [`Cluster`] is dropped, and also when the owning process dies
//! without dropping it (a small guardian process watches for that). [`Cluster::shared`] gives
//! test binaries one lazily started cluster per process.
//!
//! Access rules of every cluster:
//! - the superuser `postgres` logs in without a password over TCP on 127.0.0.1 (and the socket);
//! - the role [`SCRAM_USER`] (password [`SCRAM_PASSWORD`], `LOGIN REPLICATION`) must
//!   authenticate with scram-sha-256 over TCP, and so must the roles named in
//!   [`Options::scram_roles`].
//!
//! PostgreSQL binaries are found through `WALFOLD_PG_BINDIR`, `pg_config --bindir` or the newest
//! `/usr/lib/postgresql/*/bin`. When running as root, the server runs as the `postgres` OS user.

mod bins;
mod cluster;
mod conf;
mod control;
mod error;
mod exec;
mod guardian;
mod sql;
mod standby;
mod tls;
mod user;

pub use bins::BINDIR_ENV;
pub use cluster::{Cluster, Options};
pub use error::Error;
pub use tls::self_signed_cert;

/// Name of the role that must log in with scram-sha-256 over TCP.
pub const SCRAM_USER: &str = "walfold_scram";
/// Password of [`SCRAM_USER`].
pub const SCRAM_PASSWORD: &str = "walfold-secret";
/// Superuser that logs in without a password.
pub const SUPERUSER: &str = "postgres";
