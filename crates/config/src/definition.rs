//! What defines a projection's fold, apart from how it runs: its statement (or the
//! upsert a `table` projection generates), its filters, its version mode and its table.
//! A subscriber records it (as a normalised text and its digest) so that a definition
//! edited under the same subscriber is never folded on top of the rows the old one
//! built. Whitespace and SQL comments do not count; names (`name`, `subscriber`) and
//! tuning (`batch_size`, `parallelism`, `max_attempts`, retries, retention, `database`)
//! are not part of it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ident::QualifiedName;
use crate::model::{ProjectionConfig, ProjectionKind, VersionMode};

/// How many hex digits of the digest name a definition in IDs and logs.
pub const SHORT_DIGEST: usize = 8;

/// A projection's definition: what its fold is made of, enough to build the fold again
/// (a `sql` or `table` projection's) while its subscriber still serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoldDefinition {
    pub kind: FoldKind,
    /// Sorted, without repeats (`None`: every type).
    pub event_types: Option<Vec<String>>,
    pub aggregate_types: Option<Vec<String>>,
    pub sources: Option<Vec<String>>,
    pub version_mode: VersionMode,
    /// `strict` only: the guard ignores it.
    pub first_version: Option<i64>,
}

/// [`ProjectionKind`] as recorded: the statement and expressions as written (they are
/// compiled again from here), tables as `schema.table`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum FoldKind {
    Sql {
        statement: String,
        target: Option<String>,
    },
    Table {
        table: String,
        key: String,
        version_column: String,
        columns: BTreeMap<String, String>,
    },
    /// A projection written in Rust: its code is named by the version it declares.
    Rust {
        version: u32,
        target: Option<String>,
    },
}

impl FoldDefinition {
    /// The definition of `p`; `code_version` is a Rust projection's own version (unused
    /// for `sql` and `table` projections).
    pub fn of(p: &ProjectionConfig, code_version: u32) -> FoldDefinition {
        let kind = match &p.kind {
            ProjectionKind::Sql { statement, target } => FoldKind::Sql {
                statement: statement.clone(),
                target: target.as_ref().map(ToString::to_string),
            },
            ProjectionKind::Table {
                table,
                key,
                version_column,
                columns,
            } => FoldKind::Table {
                table: table.to_string(),
                key: key.clone(),
                version_column: version_column.clone(),
                columns: columns.clone(),
            },
            ProjectionKind::Code { target } => FoldKind::Rust {
                version: code_version,
                target: target.as_ref().map(ToString::to_string),
            },
        };
        let set = |v: &Option<Vec<String>>| {
            v.as_ref().map(|v| {
                let mut v = v.clone();
                v.sort();
                v.dedup();
                v
            })
        };
        FoldDefinition {
            kind,
            event_types: set(&p.event_types),
            aggregate_types: set(&p.aggregate_types),
            sources: set(&p.sources),
            version_mode: p.version_mode,
            first_version: (p.version_mode == VersionMode::Strict).then_some(p.first_version),
        }
    }

    /// The normalised text, one line per part: what the digest is taken of, and what a
    /// changed definition's line diff is made from.
    pub fn text(&self) -> String {
        let mut lines = Vec::new();
        match &self.kind {
            FoldKind::Sql { statement, target } => {
                lines.push("kind = sql".to_owned());
                lines.push(format!("target = {}", target.as_deref().unwrap_or("-")));
                lines.push(format!("sql = {}", normalise_sql(statement)));
            }
            FoldKind::Table {
                table,
                key,
                version_column,
                columns,
            } => {
                lines.push("kind = table".to_owned());
                lines.push(format!("table = {table}"));
                lines.push(format!("key = {key}"));
                lines.push(format!("version_column = {version_column}"));
                for (column, expr) in columns {
                    lines.push(format!("columns.{column} = {}", normalise_sql(expr)));
                }
            }
            FoldKind::Rust { version, target } => {
                lines.push("kind = rust".to_owned());
                lines.push(format!("version = {version}"));
                lines.push(format!("target = {}", target.as_deref().unwrap_or("-")));
            }
        }
        let filter =
            |v: &Option<Vec<String>>| v.as_ref().map_or("(all)".to_owned(), |v| v.join(", "));
        lines.push(format!("event_types = {}", filter(&self.event_types)));
        lines.push(format!(
            "aggregate_types = {}",
            filter(&self.aggregate_types)
        ));
        lines.push(format!("sources = {}", filter(&self.sources)));
        lines.push(format!(
            "version_mode = {}",
            match self.version_mode {
                VersionMode::Guard => "guard",
                VersionMode::Strict => "strict",
            }
        ));
        if let Some(v) = self.first_version {
            lines.push(format!("first_version = {v}"));
        }
        lines.join("\n")
    }

    /// The SHA-256 of [`FoldDefinition::text`], in hex.
    pub fn digest(&self) -> String {
        digest_of(&self.text())
    }

    /// `base` with this definition's fold (its kind, filters and version mode), its
    /// names and tuning kept; `None` for a Rust projection, whose code only the
    /// program has, or a recorded table name that no longer parses.
    pub fn apply_to(&self, base: &ProjectionConfig) -> Option<ProjectionConfig> {
        let table = |t: &Option<String>| match t {
            None => Some(None),
            Some(t) => QualifiedName::parse(t).ok().map(Some),
        };
        let kind = match &self.kind {
            FoldKind::Sql { statement, target } => ProjectionKind::Sql {
                statement: statement.clone(),
                target: table(target)?,
            },
            FoldKind::Table {
                table,
                key,
                version_column,
                columns,
            } => ProjectionKind::Table {
                table: QualifiedName::parse(table).ok()?,
                key: key.clone(),
                version_column: version_column.clone(),
                columns: columns.clone(),
            },
            FoldKind::Rust { .. } => return None,
        };
        let mut p = base.clone();
        p.kind = kind;
        p.event_types = self.event_types.clone();
        p.aggregate_types = self.aggregate_types.clone();
        p.sources = self.sources.clone();
        p.version_mode = self.version_mode;
        if let Some(v) = self.first_version {
            p.first_version = v;
        }
        Some(p)
    }
}

/// The SHA-256 of `text`, in hex.
pub fn digest_of(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The first [`SHORT_DIGEST`] hex digits of `digest`.
pub fn short_digest(digest: &str) -> &str {
    &digest[..digest.len().min(SHORT_DIGEST)]
}

/// A line diff of two normalised definitions: `- ` for lines only in `old`, `+ ` for
/// lines only in `new`, unchanged lines left out.
pub fn definition_diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    // Longest common subsequence, from the ends.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(format!("- {}", a[i]));
            i += 1;
        } else {
            out.push(format!("+ {}", b[j]));
            j += 1;
        }
    }
    out.join("\n")
}

/// SQL with its comments removed and its whitespace reduced to what separates two
/// words or two operator characters (one space); literals, quoted identifiers and
/// dollar-quoted bodies are kept exactly, and a trailing `;` goes.
pub fn normalise_sql(sql: &str) -> String {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = String::with_capacity(sql.len());
    // Whitespace (or a comment) was seen since the last character written.
    let mut gap = false;
    let mut i = 0;
    let push = |out: &mut String, gap: &mut bool, c: char| {
        if *gap {
            if let Some(prev) = out.chars().last() {
                let wordish = |c: char| is_word(c) || c == '\'' || c == '"';
                if (wordish(prev) && wordish(c)) || (is_operator(prev) && is_operator(c)) {
                    out.push(' ');
                }
            }
            *gap = false;
        }
        out.push(c);
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            gap = true;
            i += 1;
        } else if c == '-' && next == Some('-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            gap = true;
        } else if c == '/' && next == Some('*') {
            // Block comments nest in PostgreSQL.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            gap = true;
        } else if c == '\'' || c == '"' {
            // A literal or quoted identifier, its doubled quotes included.
            push(&mut out, &mut gap, c);
            i += 1;
            while i < chars.len() {
                out.push(chars[i]);
                if chars[i] == c {
                    if chars.get(i + 1) == Some(&c) {
                        out.push(c);
                        i += 2;
                        continue;
                    }
                    i += 1;
                    break;
                }
                i += 1;
            }
        } else if c == '$' && !out.chars().last().is_some_and(is_word) {
            // `$tag$ … $tag$` (not `$1`, which is a word character run).
            let tag_end = chars[i + 1..]
                .iter()
                .position(|&t| !(t.is_alphanumeric() || t == '_'))
                .map(|p| i + 1 + p);
            match tag_end {
                Some(e)
                    if chars[e] == '$' && !chars.get(i + 1).is_some_and(char::is_ascii_digit) =>
                {
                    let tag: String = chars[i..=e].iter().collect();
                    let body_start = e + 1;
                    let rest: String = chars[body_start..].iter().collect();
                    let body_len = rest.find(&tag).map_or(rest.len(), |p| p + tag.len());
                    push(&mut out, &mut gap, '$');
                    out.push_str(&tag[1..]);
                    out.push_str(&rest[..body_len]);
                    i = body_start + rest[..body_len].chars().count();
                }
                _ => {
                    push(&mut out, &mut gap, c);
                    i += 1;
                }
            }
        } else {
            push(&mut out, &mut gap, c);
            i += 1;
        }
    }
    while out.ends_with(';') {
        out.pop();
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
    }
    out
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

fn is_operator(c: char) -> bool {
    "+-*/<>=~!@#%^&|`?".contains(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn projection(entry: &str) -> ProjectionConfig {
        let text = format!(
            "[source]\nurl = \"postgresql://u@h/d\"\n[[outbox]]\ntable = \"public.outbox\"\n\
             [[projection]]\nname = \"p\"\nsubscriber = \"s.v1\"\n{entry}"
        );
        Config::from_toml(&text, Vec::new())
            .expect("valid config")
            .projection
            .remove(0)
    }

    fn digest(entry: &str) -> String {
        FoldDefinition::of(&projection(entry), 1).digest()
    }

    #[test]
    fn whitespace_and_comments_do_not_count() {
        assert_eq!(
            normalise_sql("insert  into t (a, b)\n  values (:aggregate_id, 1) -- the id\n;"),
            "insert into t(a,b)values(:aggregate_id,1)"
        );
        assert_eq!(
            normalise_sql("select /* a /* nested */ comment */ 1 + - 2"),
            "select 1+ -2"
        );
        // Literals, quoted names and dollar quotes are kept as written.
        assert_eq!(
            normalise_sql("select 'a  --b' , \"X  y\" ,$q$ a  b $q$"),
            "select 'a  --b',\"X  y\",$q$ a  b $q$"
        );
        assert_eq!(normalise_sql("select $1 ,  $2"), "select $1,$2");
        let a =
            digest("sql = \"insert into t (id) values (:aggregate_id) on conflict do nothing\"");
        let b = digest(
            "sql = \"\"\"\n-- keep the first\ninsert into t(id)\n   values (:aggregate_id)\n   on conflict do nothing\n\"\"\"",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn a_changed_fold_is_a_changed_definition() {
        let base = "sql = \"insert into t (id) values (:aggregate_id) on conflict do nothing\"";
        let d = digest(base);
        for changed in [
            "sql = \"insert into t (id) values (:aggregate_id || 'x') on conflict do nothing\"",
            &format!("{base}\nevent_types = [\"A\"]"),
            &format!("{base}\naggregate_types = [\"order\"]"),
            &format!("{base}\nversion_mode = \"strict\""),
        ] {
            assert_ne!(digest(changed), d, "{changed}");
        }
        // Filters are sets; first_version only counts in strict mode.
        assert_eq!(
            digest(&format!("{base}\nevent_types = [\"B\", \"A\", \"A\"]")),
            digest(&format!("{base}\nevent_types = [\"A\", \"B\"]"))
        );
        assert_eq!(digest(&format!("{base}\nfirst_version = 0")), d);
        assert_ne!(
            digest(&format!(
                "{base}\nversion_mode = \"strict\"\nfirst_version = 0"
            )),
            digest(&format!("{base}\nversion_mode = \"strict\""))
        );
    }

    #[test]
    fn names_and_tuning_are_not_part_of_it() {
        let base = "sql = \"insert into t (id) values (:aggregate_id) on conflict do nothing\"";
        let d = digest(base);
        for tuning in [
            "batch_size = 7",
            "parallelism = 4",
            "max_attempts = 2",
            "retry_backoff_ms = 5",
            "rebuild_batch_size = 9",
            "dedup_retention = \"1d\"",
            "drop_retired_after = \"1h\"",
            "gap_timeout = \"1m\"",
            "on_definition_change = \"accept\"",
        ] {
            assert_eq!(digest(&format!("{base}\n{tuning}")), d, "{tuning}");
        }
        let mut renamed = projection(base);
        renamed.name = "other".into();
        renamed.subscriber = "other.v2".into();
        assert_eq!(FoldDefinition::of(&renamed, 1).digest(), d);
    }

    #[test]
    fn table_projections_count_columns_and_their_expressions() {
        let t = "table = \"public.s\"\nkey = \"id\"\nversion_column = \"version\"\n";
        let d = digest(&format!("{t}columns = {{ status = \":payload.status\" }}"));
        assert_eq!(
            digest(&format!(
                "{t}columns = {{ status = \"  :payload.status  \" }}"
            )),
            d
        );
        assert_ne!(
            digest(&format!("{t}columns = {{ state = \":payload.status\" }}")),
            d
        );
        assert_ne!(
            digest(&format!(
                "{t}columns = {{ status = \"upper(:payload.status)\" }}"
            )),
            d
        );
    }

    #[test]
    fn rust_projections_count_their_version() {
        let p = ProjectionConfig::new("p", "s");
        assert_ne!(
            FoldDefinition::of(&p, 1).digest(),
            FoldDefinition::of(&p, 2).digest()
        );
        assert!(FoldDefinition::of(&p, 1).apply_to(&p).is_none());
    }

    #[test]
    fn a_recorded_definition_builds_its_fold_again() {
        let old = projection(
            "sql = \"insert into {table} (id) values (:aggregate_id) on conflict do nothing\"\n\
             target = \"public.t\"\nevent_types = [\"A\"]",
        );
        let new = projection("sql = \"insert into u (id) values (1)\"\nbatch_size = 3");
        let recorded = FoldDefinition::of(&old, 1);
        let back = recorded.apply_to(&new).expect("a sql projection");
        assert_eq!(FoldDefinition::of(&back, 1), recorded);
        assert_eq!(back.batch_size, 3);
        assert!(back.statement(0).is_ok());
    }

    #[test]
    fn the_diff_names_what_changed() {
        let old = "kind = sql\nsql = a\nevent_types = (all)";
        let new = "kind = sql\nsql = b\nevent_types = (all)";
        assert_eq!(definition_diff(old, new), "- sql = a\n+ sql = b");
        assert_eq!(definition_diff(old, old), "");
    }
}
