//! walfold's projection engine: each projection is a logical subscriber whose projectors
//! tail the event log, partitioned by aggregate, and per batch claim, apply and
//! checkpoint in one transaction. [`Pipeline`] runs ingest and projectors together.

mod error;
pub mod ops;
mod pages;
mod pipeline;
mod pool;
mod projection;
mod projector;
mod sequence;
mod sql;
mod target;

pub use error::{EngineError, ProjectionError, RebuildRefusal};
pub use pipeline::Pipeline;
pub use projection::{Applied, Projection};
pub use sql::SqlProjection;
pub use target::Target;
pub use walfold_config::{Config, ProjectionConfig};
pub use walfold_event::Event;
pub use walfold_pg::connect;
pub use walfold_store::operator::Pruned;
pub use walfold_store::Rebuild;
