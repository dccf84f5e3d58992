//! How the parts of a config see each other: the target's URL, an outbox's source, a
//! projection's target, and one source's view of the whole.

use crate::ident::QualifiedName;
use crate::model::{
    Config, ExtraTarget, OutboxConfig, PipelineConfig, ProjectionConfig, SourceConfig, TargetConfig,
};

/// One source as its reader, setup and backfill see the config: that source, its
/// outboxes, the ingest path's settings and the target its events are appended to.
/// Borrowed from the [`Config`], never a copy of it.
#[derive(Debug, Clone, Copy)]
pub struct SourceView<'a> {
    /// The whole config, for what is not one source's (other sources, projections).
    pub config: &'a Config,
    source: &'a SourceConfig,
    /// `[pipeline]`: ingest's batching and back-pressure.
    pub pipeline: &'a PipelineConfig,
    /// `[target]`: where the event log is.
    pub target: &'a TargetConfig,
}

impl<'a> SourceView<'a> {
    /// The source.
    pub fn source(&self) -> &'a SourceConfig {
        self.source
    }

    /// The outboxes in this source's database.
    pub fn outboxes(&self) -> impl Iterator<Item = &'a OutboxConfig> + 'a {
        let (config, name) = (self.config, self.source.name.as_str());
        config
            .outbox
            .iter()
            .filter(move |o| config.source_of(o) == name)
    }

    /// Its table outboxes with their tables (message outboxes have none).
    pub fn table_outboxes(&self) -> impl Iterator<Item = (&'a OutboxConfig, QualifiedName)> + 'a {
        self.outboxes()
            .filter_map(|o| o.table_name().map(|t| (o, t)))
    }

    /// Its table outbox named `table` (`schema.table`, or as written in the config).
    pub fn table_outbox(&self, table: &str) -> Option<(&'a OutboxConfig, QualifiedName)> {
        self.table_outboxes()
            .find(|(o, t)| t.to_string() == table || o.table.as_deref() == Some(table))
    }

    /// The target database URL, where its events are appended.
    pub fn target_url(&self) -> &'a str {
        self.config.target_url()
    }
}
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
        match (&self.target.url, self.source.first()) {
            (Some(url), _) => url,
            (None, Some(only)) => &only.url,
            // No source: validation says so.
            (None, None) => "",
        }
    }

    /// Every source, in config order.
    pub fn sources(&self) -> &[SourceConfig] {
        &self.source
    }

    /// The source an outbox belongs to (valid after [`Config::validate`]).
    pub fn source_of<'a>(&'a self, outbox: &'a OutboxConfig) -> &'a str {
        match (&outbox.source, self.source.first()) {
            (Some(name), _) => name,
            (None, Some(only)) => &only.name,
            (None, None) => "",
        }
    }

    /// The config as the source `name` sees it (see [`SourceView`]).
    pub fn for_source(&self, name: &str) -> Option<SourceView<'_>> {
        let source = self.source.iter().find(|s| s.name == name)?;
        Some(SourceView {
            config: self,
            source,
            pipeline: &self.pipeline,
            target: &self.target,
        })
    }

    /// One view per source ([`Config::for_source`]), in config order.
    pub fn source_views(&self) -> Vec<SourceView<'_>> {
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
