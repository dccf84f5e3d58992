//! Shared helpers for the integration tests: loading the hex fixtures and decoding them in order.

use std::path::PathBuf;

use walfold_pgoutput::{decode, Message};

/// Every fixture file, in capture order.
pub const FIXTURES: [&str; 10] = [
    "v1_insert",
    "v1_update_delete",
    "v1_truncate",
    "v1_messages",
    "v1_enum_type",
    "v1_toast",
    "v1_origin",
    "v1_binary",
    "v2_stream_commit",
    "v2_stream_abort",
];

fn hex_to_bytes(line: &str) -> Vec<u8> {
    assert!(line.len().is_multiple_of(2), "odd hex line length");
    line.as_bytes()
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).expect("ascii hex");
            u8::from_str_radix(pair, 16).expect("hex digit")
        })
        .collect()
}

/// The messages of `tests/fixtures/<name>.hex`, one per non-comment line.
pub fn load(name: &str) -> Vec<Vec<u8>> {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        &format!("{name}.hex"),
    ]
    .iter()
    .collect();
    let text = std::fs::read_to_string(&path).expect("fixture file readable");
    let mut comment_above = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            comment_above = true;
            continue;
        }
        assert!(
            comment_above,
            "{name}: message line without a comment above"
        );
        comment_above = false;
        out.push(hex_to_bytes(line.trim()));
    }
    assert!(!out.is_empty(), "{name}: no messages");
    out
}

/// Decodes messages in order, tracking Stream Start / Stream Stop for `in_stream`.
/// Returns each message with the `in_stream` flag it was decoded with.
pub fn decode_all(messages: &[Vec<u8>]) -> Vec<(bool, Message<'_>)> {
    let mut in_stream = false;
    let mut out = Vec::new();
    for (i, buf) in messages.iter().enumerate() {
        let message =
            decode(buf, in_stream).unwrap_or_else(|e| panic!("message {i} failed to decode: {e}"));
        let was = in_stream;
        match message {
            Message::StreamStart(_) => in_stream = true,
            Message::StreamStop => in_stream = false,
            _ => {}
        }
        out.push((was, message));
    }
    out
}
