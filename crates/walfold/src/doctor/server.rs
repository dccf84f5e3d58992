//! Doctor's checks of the source server's settings and of the role walfold connects as.

use super::finding::{Finding, Level};
use super::source::Source;

pub(super) fn wal_level(s: &Source<'_>) -> Vec<Finding> {
    let wal_level = &s.shape.server.wal_level;
    vec![if wal_level == "logical" {
        Finding::ok("wal_level = logical")
    } else {
        Finding::fail(
            format!("wal_level = {wal_level}"),
            "set wal_level = logical in postgresql.conf and restart the server",
        )
    }]
}

/// A slot to create needs a free one (walfold's own, once it exists, is counted).
pub(super) fn replication_slots(s: &Source<'_>) -> Vec<Finding> {
    let server = &s.shape.server;
    let (slots, used) = (server.max_replication_slots, server.replication_slots);
    vec![Finding::unless(
        s.shape.slot.is_some() || used < slots,
        Level::Fail,
        format!("max_replication_slots = {slots} ({used} used)"),
        "raise max_replication_slots (restart needed)",
    )]
}

pub(super) fn wal_senders(s: &Source<'_>) -> Vec<Finding> {
    let server = &s.shape.server;
    let (senders, sending) = (server.max_wal_senders, server.wal_senders);
    vec![Finding::unless(
        sending < senders,
        Level::Warn,
        format!("max_wal_senders = {senders} ({sending} streaming)"),
        "raise max_wal_senders (restart needed)",
    )]
}

/// Without a limit, a stopped consumer's slot keeps WAL until the disk is full.
pub(super) fn slot_wal_keep_size(s: &Source<'_>) -> Vec<Finding> {
    let keep = &s.shape.server.max_slot_wal_keep_size;
    vec![if keep == "-1" {
        Finding::warn(
            "max_slot_wal_keep_size = -1 (unlimited)",
            "set max_slot_wal_keep_size (e.g. '50GB') so a stopped consumer cannot fill the disk; a slot that exceeds it is invalidated and walfold stops loudly",
        )
    } else {
        Finding::ok(format!("max_slot_wal_keep_size = {keep}"))
    }]
}

pub(super) fn replication_role(s: &Source<'_>) -> Vec<Finding> {
    let role = s.role();
    vec![Finding::unless(
        s.shape.role.replication,
        Level::Fail,
        format!("the source role {role} may replicate"),
        format!("alter role {role} replication (on RDS/Aurora: grant rds_replication to {role})"),
    )]
}
