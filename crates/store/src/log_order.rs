//! The one place that orders the event log. Projectors read it by `seq`, so a `seq` may
//! only become visible after every lower one: a transaction that assigns `seq`s holds
//! [`LogOrder`] from reading the head until its commit has returned. Every source's
//! appender shares one `LogOrder`, so their transactions take turns and the log stays
//! one sequence (each source's own commit order kept by its appender).
//!
//! Across processes, a session-level advisory lock (the appender lock) on a connection
//! of its own keeps a second writer (a `walfold backfill`, another daemon) out. It is
//! checked on every turn: a turn on a closed session retakes the lock or fails.
//!
//! A turn that ends without [`Turn::advance`] (an error, a commit whose outcome is
//! unknown) forgets the head; the next turn reads it again from the table.

use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::Client;

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::connect;
use walfold_pg::RowExt;

/// Advisory-lock class of the appender lock (`'walf'`); the key is the schema's hash.
const APPENDER_LOCK: i32 = 0x7761_6c66;

/// The appender lock and the log's head, shared by every appender of a schema.
pub struct LogOrder {
    url: String,
    schema: Schema,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The session holding the appender lock.
    session: Option<Client>,
    /// The highest `seq` in the log (`None`: read it at the next turn).
    head: Option<i64>,
}

/// One transaction's turn: the head it starts from, held until it ends.
pub struct Turn<'a> {
    state: MutexGuard<'a, State>,
    head: i64,
    advanced: bool,
}

impl LogOrder {
    /// The order of `schema`'s log; the lock is taken at the first turn.
    pub fn new(url: &str, schema: &Schema) -> LogOrder {
        LogOrder {
            url: url.to_owned(),
            schema: schema.clone(),
            state: Mutex::new(State::default()),
        }
    }

    /// Takes the appender lock of `schema` (fails with [`StoreError::Busy`] while
    /// another process holds it).
    pub async fn acquire(url: &str, schema: &Schema) -> Result<LogOrder, StoreError> {
        let order = LogOrder::new(url, schema);
        order.turn().await?.advance_none();
        Ok(order)
    }

    /// Waits for the turn; (re)takes the lock and reads the head when needed.
    pub async fn turn(&self) -> Result<Turn<'_>, StoreError> {
        let mut state = self.state.lock().await;
        if state.session.as_ref().is_none_or(Client::is_closed) {
            state.session = None;
            state.head = None;
            state.session = Some(self.lock_session().await?);
        }
        let head = match state.head {
            Some(h) => h,
            None => {
                let session = state.session.as_ref().expect("taken above");
                let h = head(session, &self.schema).await?;
                state.head = Some(h);
                h
            }
        };
        Ok(Turn {
            state,
            head,
            advanced: false,
        })
    }

    async fn lock_session(&self) -> Result<Client, StoreError> {
        let client = connect(&self.url).await?;
        client
            .batch_execute(walfold_pg::SERVER_KEEPALIVES)
            .await
            .map_err(StoreError::db("configuring the appender lock session"))?;
        let locked: bool = client
            .query_one(
                "select pg_try_advisory_lock($1::int4, hashtext($2)) as locked",
                &[&APPENDER_LOCK, &self.schema.name()],
            )
            .await
            .map_err(StoreError::db("taking the appender lock"))?
            .of("the appender lock")
            .col("locked")?;
        if !locked {
            return Err(StoreError::Busy(format!(
                "another walfold is appending to {}.event_log; waiting for it to stop",
                self.schema.name()
            )));
        }
        Ok(client)
    }
}

impl Turn<'_> {
    /// The highest `seq` in the log: this transaction's first event is `head() + 1`.
    pub fn head(&self) -> i64 {
        self.head
    }

    /// This turn's transaction committed; the log's head is now `head`.
    pub fn advance(mut self, head: i64) {
        self.state.head = Some(head);
        self.advanced = true;
    }
}

impl Turn<'_> {
    /// Ends a turn that wrote no event (the head stays known).
    pub fn advance_none(self) {
        let head = self.head;
        self.advance(head);
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.advanced {
            self.state.head = None;
        }
    }
}

/// The highest seq in the log (0 when empty).
const HEAD: &str = "select coalesce(max(seq), 0) as head from {schema}.event_log";

/// The position before the log's first event (what pruning left); 0 when empty.
const START: &str = "select coalesce(min(seq) - 1, 0) as start from {schema}.event_log";

/// The position before the log's first event: positions after it are the log's span
/// (a rebuild's progress is counted in them).
pub async fn start(
    client: &impl tokio_postgres::GenericClient,
    schema: &Schema,
) -> Result<i64, StoreError> {
    Ok(client
        .query_one(&schema.sql(START), &[])
        .await
        .map_err(StoreError::db("reading the event log's first position"))?
        .of("event_log")
        .col("start")?)
}

/// The log's head: the highest seq (0 when empty).
pub async fn head(
    client: &impl tokio_postgres::GenericClient,
    schema: &Schema,
) -> Result<i64, StoreError> {
    Ok(client
        .query_one(&schema.sql(HEAD), &[])
        .await
        .map_err(StoreError::db("reading the event log head"))?
        .of("event_log")
        .col("head")?)
}
