//! Config files written from Rust, for the demo and the tests: the sections they share
//! (`[source]`, `[[outbox]]`, the knobs of `[pipeline]`, `[retention]`, `[log]`) are
//! spelled here once, and projections stay TOML text their caller owns. The result is a
//! file's text, read back through [`Config::from_toml`](crate::Config::from_toml) like any
//! other, so nothing built here skips validation.

use std::fmt::Write;

/// `key = value` lines of one table, in the order they were set.
type Keys = Vec<(String, toml::Value)>;

/// A config file built section by section; [`ConfigBuilder::to_toml`] is its text.
///
/// No `Debug`: the source URL may carry a password.
#[derive(Clone)]
pub struct ConfigBuilder {
    source: Keys,
    outboxes: Vec<Keys>,
    sections: Vec<(String, Keys)>,
    text: Vec<String>,
}

impl ConfigBuilder {
    /// A config whose `[source]` is the database at `url`.
    pub fn new(url: &str) -> ConfigBuilder {
        ConfigBuilder {
            source: vec![("url".into(), url.into())],
            outboxes: Vec::new(),
            sections: Vec::new(),
            text: Vec::new(),
        }
    }

    /// Sets `key` in `[source]` (`slot`, `publication`, …).
    pub fn source(mut self, key: &str, value: impl Into<toml::Value>) -> ConfigBuilder {
        put(&mut self.source, key, value.into());
        self
    }

    /// Adds an `[[outbox]]` for `table` with the default column mapping.
    pub fn outbox_table(mut self, table: &str) -> ConfigBuilder {
        self.outboxes.push(vec![("table".into(), table.into())]);
        self
    }

    /// Adds an `[[outbox]]` of logical decoding messages whose prefix is `prefix`.
    pub fn message_outbox(mut self, prefix: &str) -> ConfigBuilder {
        self.outboxes
            .push(vec![("message_prefix".into(), prefix.into())]);
        self
    }

    /// Sets `key` in the table `[section]` (`pipeline`, `retention`, `log`, …); a key set
    /// twice keeps the last value.
    pub fn set(mut self, section: &str, key: &str, value: impl Into<toml::Value>) -> ConfigBuilder {
        let value = value.into();
        match self.sections.iter_mut().find(|(name, _)| name == section) {
            Some((_, keys)) => put(keys, key, value),
            None => self
                .sections
                .push((section.into(), vec![(key.into(), value)])),
        }
        self
    }

    /// Appends TOML text after the sections, in order: `[[projection]]` entries, other
    /// tables.
    pub fn text(mut self, text: &str) -> ConfigBuilder {
        self.text.push(text.into());
        self
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        table(&mut out, "[source]", &self.source);
        for outbox in &self.outboxes {
            table(&mut out, "[[outbox]]", outbox);
        }
        for (name, keys) in &self.sections {
            table(&mut out, &format!("[{name}]"), keys);
        }
        for text in &self.text {
            out.push_str(text);
            out.push('\n');
        }
        out
    }
}

fn put(keys: &mut Keys, key: &str, value: toml::Value) {
    match keys.iter_mut().find(|(k, _)| k == key) {
        Some((_, v)) => *v = value,
        None => keys.push((key.into(), value)),
    }
}

fn table(out: &mut String, header: &str, keys: &Keys) {
    out.push_str(header);
    out.push('\n');
    for (key, value) in keys {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "{key} = {value}");
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::ConfigBuilder;
    use crate::Config;

    const PROJECTION: &str = r#"
[[projection]]
name = "ledger"
subscriber = "ledger.v1"
sql = "insert into ledger (id) values (:event_id)"
"#;

    #[test]
    fn what_it_builds_is_a_valid_config_with_every_value_set() {
        let text = ConfigBuilder::new("postgresql://walfold@127.0.0.1:5432/app")
            .source("slot", "walfold_demo")
            .outbox_table("public.outbox")
            .message_outbox("walfold:accounts")
            .set("pipeline", "max_backoff_ms", 1000)
            .set("retention", "prune_interval_s", 0)
            .set("pipeline", "shutdown_timeout_s", 20)
            .set("pipeline", "max_backoff_ms", 2000)
            .set("log", "level", "warn")
            .text(PROJECTION)
            .to_toml();
        let config = Config::from_toml(&text, Vec::<(String, String)>::new()).expect(&text);
        assert_eq!(config.source[0].slot, "walfold_demo");
        assert_eq!(config.outbox.len(), 2);
        assert_eq!(config.projection[0].name, "ledger");
        assert!(
            text.contains("[pipeline]\nmax_backoff_ms = 2000\nshutdown_timeout_s = 20\n"),
            "one [pipeline], the last value of a key set twice:\n{text}"
        );
        assert!(text.contains("[log]\nlevel = \"warn\"\n"), "{text}");
    }
}
