//! walfold's configuration: one TOML file, every value overridable from `WALFOLD_…`
//! environment variables, validated as a whole so every problem is reported at once.

pub mod builder;
mod compile;
pub mod conninfo;
pub mod defaults;
mod definition;
mod duration;
mod env;
mod error;
mod ident;
mod model;
mod outbox;
pub mod presets;
mod raw;
mod redact;
mod template;
mod validate;
mod view;

pub use definition::{
    definition_diff, digest_of, normalise_sql, short_digest, FoldDefinition, FoldKind, SHORT_DIGEST,
};
pub use duration::{parse_retention, Retention};
pub use error::{ConfigError, Problem};
pub use ident::{quote_ident, QualifiedName};
pub use model::{
    ClusterConfig, Config, ExtraTarget, IdField, LogConfig, LogFormat, MetricsConfig,
    OnDefinitionChange, OnSlotLost, OutboxConfig, OutboxField, PipelineConfig, ProjectionConfig,
    ProjectionKind, RetentionConfig, SourceConfig, Statement, TableProjection, TargetConfig,
    VersionMode, HEARTBEAT_PREFIX, INGEST_SUBSCRIBER,
};
pub use redact::{redact_url, without_password};
pub use template::{ParamType, Placeholder, Template, TemplateError, Upsert};
pub use view::SourceView;

use std::path::Path;

impl Config {
    /// Reads `path`, applies `WALFOLD_…` overrides from the process environment and validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text, std::env::vars())
    }

    /// Parses TOML text, applies the given `WALFOLD_…` overrides and validates.
    pub fn from_toml(
        text: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut doc: toml::Table = toml::from_str(text).map_err(ConfigError::parse)?;
        env::apply_overrides(&mut doc, vars)?;
        let config: Config = doc.try_into().map_err(ConfigError::parse)?;
        config.validate()?;
        Ok(config)
    }
}
