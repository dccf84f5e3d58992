//! Talking to PostgreSQL, for every walfold crate that opens a connection (the
//! replication source, the store, the binary): connecting from a libpq-style URL with
//! TLS per `sslmode`, recognising a pooler that shares server sessions, deadlines for
//! the commands that must answer within seconds, reading rows through one fallible
//! conversion, and reading a PostgreSQL error (its SQLSTATE, its kind, one line of
//! text). It knows no walfold table.
//!
//! Modules depend downwards only: `error` on nothing here; `tls` and `row` on `error`;
//! `connect` on `tls`; `pooler` and `deadline` on `connect`.

mod connect;
mod deadline;
mod error;
mod pooler;
mod row;
mod tls;

pub use connect::{
    connect, connect_listening, tag_sessions, ConnectOptions, Notice, SERVER_KEEPALIVES,
    SESSION_TAG_CLASS, WORKER_SESSION,
};
pub use deadline::{
    answer_within, connect_for_command, connect_within, ServerError, CONNECT_TIMEOUT,
    STATEMENT_TIMEOUT,
};
pub use error::{describe, kind_of, pooler_fix, sqlstate, PgError};
pub use pooler::{pooling, refuse_pooling, Pooling};
pub use row::{Column, Columns, FromRow, RowExt};
pub use tls::{client_config as tls_client_config, SslMode};
