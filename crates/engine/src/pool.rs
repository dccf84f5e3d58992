//! A target's connections as a budget. Every projector partition of a target (live and
//! rebuilding, any number of projections) takes turns on at most `size` connections:
//! a partition leases one for one turn (read a page, claim, apply, checkpoint, commit)
//! and gives it back, so the database never sees more than the budget however many
//! projections run, and a waiting partition gets the next free connection in arrival
//! order (a fair semaphore), so none starves.
//!
//! A connection goes back only after a turn that ended well ([`Lease::release`]); one
//! dropped after an error is closed, so no failed session state, aborted transaction or
//! stale prepared statement is ever handed to the next partition. What a partition
//! prepared stays with the connection for its next turn there ([`Lease::prepared`]).

use std::any::Any;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::Client;
use walfold_store::StoreError;

/// What partitions prepared on a connection, by their own key.
pub(crate) type Prepared = HashMap<Arc<str>, Box<dyn Any + Send + Sync>>;

/// The connections walfold's projectors hold on one target.
pub(crate) struct Pool {
    url: String,
    size: usize,
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    client: Client,
    prepared: Prepared,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("size", &self.size).finish()
    }
}

impl Pool {
    pub(crate) fn new(url: &str, size: usize) -> Arc<Pool> {
        let size = size.max(1);
        Arc::new(Pool {
            url: url.to_owned(),
            size,
            permits: Arc::new(Semaphore::new(size)),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// A connection for one turn: an idle one, or a new one while the budget allows;
    /// else waits for one to be given back.
    pub(crate) async fn lease(self: &Arc<Self>) -> Result<Lease, StoreError> {
        let permit =
            self.permits.clone().acquire_owned().await.map_err(|_| {
                StoreError::Busy("the projectors' connection pool is closed".into())
            })?;
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            std::iter::from_fn(|| idle.pop()).find(|c| !c.client.is_closed())
        };
        let (client, prepared) = match reused {
            Some(Idle { client, prepared }) => (client, prepared),
            None => {
                let client = walfold_pg::connect(&self.url).await?;
                client
                    .batch_execute(walfold_pg::WORKER_SESSION)
                    .await
                    .map_err(|source| StoreError::Db {
                        context: "configuring the projector session".into(),
                        source,
                    })?;
                (client, Prepared::new())
            }
        };
        Ok(Lease {
            pool: self.clone(),
            client: Some(client),
            prepared,
            keep: false,
            retire: false,
            _permit: permit,
        })
    }
}

/// A connection of the pool, held for one turn. Dropped without [`Lease::release`], it
/// is closed and its place in the budget freed.
pub(crate) struct Lease {
    pool: Arc<Pool>,
    client: Option<Client>,
    pub(crate) prepared: Prepared,
    keep: bool,
    /// Closed at the end of the turn however it ends (see [`Lease::retire`]).
    retire: bool,
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    /// The turn ended well: the connection goes back to the pool for the next turn.
    pub(crate) fn release(mut self) {
        self.keep = true;
    }

    /// Closes the connection after this turn: it carried a value larger than a page
    /// may hold, and tokio-postgres keeps its buffers at the largest message they held.
    pub(crate) fn retire(&mut self) {
        self.retire = true;
    }
}

impl Deref for Lease {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client
            .as_ref()
            .expect("a lease holds its client until dropped")
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut Client {
        self.client
            .as_mut()
            .expect("a lease holds its client until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if self.keep && !self.retire && !client.is_closed() {
            let prepared = std::mem::take(&mut self.prepared);
            let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.push(Idle { client, prepared });
        }
        // Else the client is dropped here, which closes the connection; the permit is
        // released after, so a new connection never overlaps the closed one's slot.
    }
}
