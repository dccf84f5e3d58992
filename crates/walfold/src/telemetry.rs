//! Logs through `tracing`: text or JSON on stderr, filter from `RUST_LOG` or config.

use std::fmt;
use std::io::IsTerminal;

use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::EnvFilter;
use walfold_config::{LogConfig, LogFormat};

pub fn init(log: &LogConfig) {
    // sqlx reports the server's notices at info ("schema … already exists, skipping" on
    // every start): noise, unless asked for.
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(format!("sqlx::postgres::notice=warn,{}", log.level)))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal: a log file or journald gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match log.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.fmt_fields(EscapedFields).try_init(),
    };
}

/// The text format's fields as [`DefaultFields`] writes them, control characters
/// escaped: a value a producer wrote (an aggregate ID, an error quoting a payload) is
/// one line of the log however many newlines it holds. JSON escapes them by itself.
struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut plain = String::new();
        DefaultFields::new().format_fields(Writer::new(&mut plain), fields)?;
        writer.write_str(&crate::text::escape_controls(&plain))
    }
}
