//! Any bytes, in or out of a streamed block: the decoder returns a message or an error,
//! never panics; a decoded Insert's text values parse or fail cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walfold_pgoutput::{decode, parse_text, Column, Message};

fuzz_target!(|data: &[u8]| {
    let Some((&flag, buf)) = data.split_first() else {
        return;
    };
    if let Ok(Message::Insert(insert)) = decode(buf, flag & 1 == 1) {
        for (i, column) in insert.new.columns.iter().enumerate() {
            if let Column::Text(bytes) = column {
                let _ = parse_text([16, 20, 25, 114, 1700, 2950, 3802][i % 7], bytes);
            }
        }
    }
});
