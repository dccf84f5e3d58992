//! How the parts of a config see each other: the target's URL, an outbox's source, a
//! projection's target, and one source's view of the whole.

use crate::ident::QualifiedName;
use crate::model::{Config, ExtraTarget, OutboxConfig, ProjectionConfig, SourceConfig};
impl Config {
    /// The table outboxes with their tables (message outboxes have none).
    pub fn table_outboxes(&self) -> impl Iterator<Item = (&OutboxConfig, QualifiedName)> {
        self.outbox
            .iter()
            .filter_map(|o| o.table_name().map(|t| (o, t)))
    }

    /// The table outbox named `table` (`schema.table`, or as written in the config).
    pub fn table_outbox(&self, table: &str) -> Option<(&OutboxConfig, QualifiedName)> {
        self.table_outboxes()
            .find(|(o, t)| t.to_string() == table || o.table.as_deref() == Some(table))
    }

    /// The target database URL (`target.url`, else the only source's URL).
    pub fn target_url(&self) -> &str {
        self.target.url.as_deref().unwrap_or(&self.source().url)
    }

    /// The first source: the only one in a single-source config, and in every view made
    /// by [`Config::for_source`].
    pub fn source(&self) -> &SourceConfig {
        &self.source[0]
    }

    /// Every source, in config order.
    pub fn sources(&self) -> &[SourceConfig] {
        &self.source
    }

    /// The source an outbox belongs to (valid after [`Config::validate`]).
    pub fn source_of<'a>(&'a self, outbox: &'a OutboxConfig) -> &'a str {
        outbox.source.as_deref().unwrap_or(&self.source().name)
    }

    /// The config as one source sees it: only that source, only its outboxes, the
    /// target made explicit. Readers, setup and backfill work on such a view.
    pub fn for_source(&self, name: &str) -> Option<Config> {
        let source = self.source.iter().find(|s| s.name == name)?.clone();
        let mut view = self.clone();
        view.target.url = Some(self.target_url().to_owned());
        view.outbox = self
            .outbox
            .iter()
            .filter(|o| self.source_of(o) == name)
            .cloned()
            .map(|mut o| {
                o.source = Some(name.to_owned());
                o
            })
            .collect();
        view.source = vec![source];
        Some(view)
    }

    /// One view per source ([`Config::for_source`]), in config order.
    pub fn source_views(&self) -> Vec<Config> {
        self.source
            .iter()
            .filter_map(|s| self.for_source(&s.name))
            .collect()
    }

    /// The extra target a projection's state lives on (`None`: the main target).
    pub fn target_of(&self, projection: &ProjectionConfig) -> Option<(&str, &ExtraTarget)> {
        let name = projection.database.as_deref()?;
        self.targets
            .get_key_value(name)
            .map(|(n, t)| (n.as_str(), t))
    }
}
