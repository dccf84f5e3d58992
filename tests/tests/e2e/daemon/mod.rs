//! The real `walfold` binary: configuration errors, clean stops, crashes at random and
//! at the exact crash windows, server restarts, and setup errors.
//!
//! By behaviour: configuration and setup refused with the fix (`setup.rs`), stops,
//! crashes and restarts (`crashes.rs`), the slot (`slot.rs`), the publication
//! (`publication.rs`), malformed rows and dead letters (`malformed_rows.rs`), what
//! `/readyz` and `status` say (`status.rs`), work that stops moving (`stall.rs`).

mod crashes;
mod malformed_rows;
mod publication;
mod setup;
mod slot;
mod stall;
mod status;

/// Event `n` (its ID `5f0c6a1e-…-n`), an `OrderPaid` of `amount` for `order`, as an
/// outbox insert.
fn paid(n: u32, order: &str, amount: &str) -> String {
    walfold_tests::insert_event(
        &format!("5f0c6a1e-0000-4000-8000-{n:012}"),
        order,
        "OrderPaid",
        1,
        &format!(r#"{{"status": "paid", "amount": "{amount}"}}"#),
    )
}
