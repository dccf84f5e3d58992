//! What an outbox row or message cannot be: larger than `pipeline.max_event_bytes`, read
//! from a large object's column, or JSON holding `\u0000`, which jsonb cannot store.

use walfold_pgoutput::oid;

/// Why a field cannot be read from a column of type `type_oid`, if it cannot: `oid` is
/// the type of a large object's reference (`lo_import`, JPA's `@Lob` on PostgreSQL).
/// Logical decoding sends the reference's number, never the object, so a field read from
/// such a column would fold a number where the content belongs.
pub fn unreadable_type(type_oid: u32) -> Option<&'static str> {
    (type_oid == oid::OID).then_some(
        "is of type oid: a large object's reference, and logical decoding cannot read large \
         objects (walfold would see the object's number, not its content)",
    )
}

/// The fix for a field read from a large object's column.
pub fn unreadable_fix(key: &str) -> String {
    format!(
        "store the content in the row instead (alter the column to jsonb, json, text or bytea \
         holding UTF-8 JSON, and have the application write it there), or set {key} to a \
         column that holds it"
    )
}

/// jsonb cannot hold `\u0000`; a `json` or `text` column can. Such a row would make the
/// event-log insert fail, so it is rejected here with its reason.
pub(super) fn refuse_nul(text: &str, what: impl FnOnce() -> String) -> Result<(), String> {
    if has_nul_escape(text) {
        Err(format!(
            "{} contains \\u0000, which jsonb cannot store",
            what()
        ))
    } else {
        Ok(())
    }
}

/// Whether JSON text holds a `\u0000` escape. Only a backslash that is not itself escaped
/// starts one: `"\\u0000"` (an escaped backslash, then `u0000`) is six ordinary characters,
/// so the run of backslashes before `u0000` must be odd.
pub(super) fn has_nul_escape(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'\\').count();
        i += run;
        if run % 2 == 1 && bytes[i..].starts_with(b"u0000") {
            return true;
        }
    }
    false
}

/// Values of a too large row kept in its dead letter: its IDs and names, not its payload.
pub(super) const SMALL: usize = 1024;

pub(super) fn too_large(what: &str, size: usize, max: usize) -> String {
    format!("the {what} is {size} bytes, over pipeline.max_event_bytes ({max}): not an event")
}
