//! Reading without writing: stream the slot up to a position, decode and map every
//! change, store nothing and acknowledge nothing. The benchmark's decode scenario.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use walfold_config::SourceView;
use walfold_event::Lsn;

use crate::error::SourceError;
use crate::feedback;
use crate::reader::{replication_config, Item, Reader};

/// What a decode-only pass saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeStats {
    pub events: u64,
    pub rejected: u64,
    pub transactions: u64,
}

/// Streams `config.source().slot` from its confirmed position until a transaction at or
/// after `stop_at` begins. The slot is not moved.
pub async fn decode_only(
    config: &SourceView<'_>,
    stop_at: Lsn,
) -> Result<DecodeStats, SourceError> {
    let (durable, ack) = feedback::channel();
    drop(durable);
    let (tx, mut rx) = mpsc::channel(config.pipeline.channel_capacity);
    let counter = tokio::spawn(async move {
        let mut stats = DecodeStats::default();
        while let Some((item, _)) = rx.recv().await {
            match item {
                Item::Event(_) => stats.events += 1,
                Item::Rejected(_) => stats.rejected += 1,
                Item::Through(_) => stats.transactions += 1,
                Item::Staged(walfold_store::StagedChange {
                    row: walfold_store::StagedRow::Event(_),
                    ..
                }) => stats.events += 1,
                Item::Staged(_) => stats.rejected += 1,
                Item::StreamCommit { .. } => stats.transactions += 1,
                Item::Ignored | Item::StreamAbort { .. } => {}
            }
        }
        stats
    });
    let cfg = replication_config(config)?
        .with_stop_lsn(stop_at)
        .with_status_interval(Duration::from_secs(10));
    let reader = Reader::new(config, tx, Lsn::ZERO);
    reader.run(cfg, ack, &CancellationToken::new()).await?;
    counter
        .await
        .map_err(|e| SourceError::Decode(e.to_string()))
}
