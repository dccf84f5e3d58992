//! Doctor's check of `synchronized_standby_slots` beside a failover slot (PostgreSQL 17
//! and later): the primary names there the standbys' physical slots that walfold's slot
//! waits for, so it never confirms what no standby has. Asked for only where there is a
//! standby to name (a physical slot, or a physical WAL sender): on a server without one
//! an empty setting is right, and a warning would ask for slots that do not exist.

use walfold_source::shape::Server;

use super::finding::Finding;

/// What `synchronized_standby_slots` means on `server`, whose slot is a failover slot.
pub(super) fn synchronized_standby_slots(server: &Server) -> Finding {
    let standbys = &server.synchronized_standby_slots;
    let (slots, senders) = (server.physical_slots, server.physical_senders);
    if !standbys.is_empty() {
        return Finding::ok(format!("synchronized_standby_slots = '{standbys}'"));
    }
    if slots == 0 && senders == 0 {
        return Finding::ok(
            "synchronized_standby_slots is empty and this server has no physical standby \
             (no physical slot, no physical WAL sender): nothing to sync the failover slot \
             to; when you add a standby, name its physical slot there",
        );
    }
    Finding::warn(
        format!(
            "synchronized_standby_slots is empty while this server has {slots} physical \
             slot(s) and {senders} physical WAL sender(s): a standby promoted after a \
             failover may lack what walfold confirmed, and its copy of the slot is dropped"
        ),
        "name the standbys' physical slots in synchronized_standby_slots on the primary, so \
         walfold's slot never passes what they have; and set sync_replication_slots = on \
         (with hot_standby_feedback = on and a primary_slot_name) on each standby",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::finding::Level;

    fn server(standbys: &str, physical_slots: i32, physical_senders: i32) -> Server {
        Server {
            wal_level: "logical".into(),
            version: 170_000,
            max_replication_slots: 10,
            replication_slots: 1 + physical_slots,
            max_wal_senders: 10,
            wal_senders: 1 + physical_senders,
            max_slot_wal_keep_size: "-1".into(),
            synchronized_standby_slots: standbys.into(),
            sync_replication_slots: "off".into(),
            physical_slots,
            physical_senders,
        }
    }

    #[test]
    fn an_empty_setting_warns_only_where_there_is_a_standby_to_name() {
        let level = |s: &Server| synchronized_standby_slots(s).level;
        assert_eq!(level(&server("", 0, 0)), Level::Ok, "no standby");
        assert_eq!(level(&server("", 1, 0)), Level::Warn, "a physical slot");
        assert_eq!(
            level(&server("", 0, 1)),
            Level::Warn,
            "a standby without a slot"
        );
        assert_eq!(level(&server("standby_a", 1, 1)), Level::Ok, "named");
        assert!(synchronized_standby_slots(&server("", 0, 0))
            .what
            .contains("no physical standby"));
    }
}
