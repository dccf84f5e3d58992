//! Configuration errors: each names the key and says what to fix.

use std::fmt;

/// One problem found in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key, e.g. `projection[0].sql` or `source.slot`.
    pub key: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config: {0}")]
    Parse(String),
    #[error("invalid config:\n{}", list(.0))]
    Invalid(Vec<Problem>),
}

impl ConfigError {
    pub(crate) fn parse(err: impl fmt::Display) -> Self {
        // toml's messages span several lines with a caret diagram; keep them whole,
        // they name the key (`unknown field`, `missing field`) and the line, which may
        // be a URL with its password.
        ConfigError::Parse(crate::redact::redact_urls_in(err.to_string().trim_end()))
    }

    /// The problems, when the config parsed but did not validate.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(p) => p,
            _ => &[],
        }
    }
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}
