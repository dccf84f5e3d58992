//! Validation: every problem of a config, reported at once with its key.

use crate::error::{ConfigError, Problem};
use crate::ident::{is_identifier, QualifiedName, IDENTIFIER_RULE};
use crate::model::{
    Config, IdField, OnDefinitionChange, ProjectionConfig, HEARTBEAT_PREFIX, INGEST_SUBSCRIBER,
};
impl Config {
    /// Checks everything and reports every problem at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_with(&[])
    }

    /// Checks everything with `code`, projections written in Rust (`Pipeline::with_projection`),
    /// as if they were `[[projection]]` entries; their problems' keys name them
    /// `with_projection("NAME")`.
    pub fn validate_with(&self, code: &[ProjectionConfig]) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let mut push = |key: &str, message: String| {
            problems.push(Problem {
                key: key.to_owned(),
                message,
            })
        };
        self.validate_sources(&mut push);
        if let Some(url) = &self.target.url {
            check_url(&mut push, "target.url", url);
        }
        if !is_identifier(&self.target.schema) {
            push(
                "target.schema",
                format!(
                    "`{}` is not a valid name: {IDENTIFIER_RULE}",
                    self.target.schema
                ),
            );
        }
        if self.outbox.is_empty() {
            push(
                "outbox",
                "missing: add at least one [[outbox]] (a table, or a message_prefix) to follow"
                    .into(),
            );
        }
        let mut tables = Vec::new();
        let mut prefixes = Vec::new();
        for (i, o) in self.outbox.iter().enumerate() {
            match &o.source {
                Some(name) if !self.source.iter().any(|s| s.name == *name) => push(
                    &format!("outbox[{i}].source"),
                    format!("no [[source]] is named `{name}` (sources: {})", self.source_names()),
                ),
                None if self.source.len() > 1 => push(
                    &format!("outbox[{i}].source"),
                    format!(
                        "missing: with several sources, name the one whose database holds this outbox ({})",
                        self.source_names()
                    ),
                ),
                _ => {}
            }
            match (&o.table, &o.message_prefix) {
                // Twice in one source's database; two databases may share names.
                (Some(table), None) => match QualifiedName::parse(table) {
                    Ok(n) if tables.contains(&(self.source_of(o), n.clone())) => {
                        push(&format!("outbox[{i}].table"), "listed twice".into())
                    }
                    Ok(n) => tables.push((self.source_of(o), n)),
                    Err(m) => push(&format!("outbox[{i}].table"), m),
                },
                (None, Some(prefix)) => match check_prefix(prefix) {
                    Err(m) => push(&format!("outbox[{i}].message_prefix"), m),
                    Ok(()) if prefixes.contains(&(self.source_of(o), prefix)) => {
                        push(&format!("outbox[{i}].message_prefix"), "listed twice".into())
                    }
                    Ok(()) => prefixes.push((self.source_of(o), prefix)),
                },
                (None, None) => push(
                    &format!("outbox[{i}].table"),
                    "missing: set table (an outbox table) or message_prefix (transactional \
                     pg_logical_emit_message calls)"
                        .into(),
                ),
                (Some(_), Some(_)) => push(
                    &format!("outbox[{i}].message_prefix"),
                    "set either table or message_prefix, not both: one [[outbox]] per source of events"
                        .into(),
                ),
            }
            if let Some(scope) = &o.id_scope {
                let key = format!("outbox[{i}].id_scope");
                match scope.strip_prefix("message_prefix:") {
                    Some(prefix) => {
                        if let Err(m) = check_prefix(prefix) {
                            push(&key, m);
                        }
                    }
                    None => {
                        if let Err(m) = QualifiedName::parse(scope) {
                            push(
                                &key,
                                format!("{m} (a table's name, or message_prefix:<prefix>)"),
                            );
                        }
                    }
                }
            }
            if let Some(j) = self.outbox[..i]
                .iter()
                .position(|other| other.id_scope() == o.id_scope())
            {
                if o.id_scope.is_some() || self.outbox[j].id_scope.is_some() {
                    push(
                        &format!("outbox[{i}].id_scope"),
                        format!(
                            "the same as outbox[{j}]'s ({}): rows of both with the same ID value \
                             would be one event; give each outbox its own scope",
                            o.id_scope()
                        ),
                    );
                }
            }
            if o.allow_public_emit && o.table.is_some() && o.message_prefix.is_none() {
                push(
                    &format!("outbox[{i}].allow_public_emit"),
                    "only a message outbox (message_prefix) takes it: a table outbox's events \
                     are written by whoever may insert into the table"
                        .into(),
                );
            }
            if let Some(name) = &o.preset {
                if crate::presets::preset(name).is_none() {
                    let names: Vec<&str> = crate::presets::PRESETS.iter().map(|p| p.name).collect();
                    push(
                        &format!("outbox[{i}].preset"),
                        format!(
                            "no preset is named `{name}` (presets: {})",
                            if names.is_empty() {
                                "none".into()
                            } else {
                                names.join(", ")
                            }
                        ),
                    );
                }
            }
            if o.message_prefix.is_some() {
                // A message's fields are its JSON keys: no row to evaluate expressions over.
                let table_only = [
                    ("preset", o.preset.is_some()),
                    ("where", o.r#where.is_some()),
                    ("expand", o.expand.is_some()),
                    ("id", matches!(o.id, Some(IdField::Composite(_)))),
                ];
                for (key, set) in table_only {
                    if set {
                        push(
                            &format!("outbox[{i}].{key}"),
                            format!(
                                "a message outbox's fields are JSON keys of its messages: {} \
                                 is for table outboxes",
                                if key == "id" { "a composite id" } else { key }
                            ),
                        );
                    }
                }
                for f in o.fields() {
                    if !f.is_column() {
                        push(
                            &format!("outbox[{i}].{}", f.name()),
                            format!(
                                "`{}` is not a valid JSON key: {IDENTIFIER_RULE} (expressions \
                                 are for table outboxes)",
                                f.value
                            ),
                        );
                    }
                }
            } else {
                if matches!(&o.id, Some(IdField::Composite(parts)) if parts.is_empty()) {
                    push(
                        &format!("outbox[{i}].id"),
                        "an empty array: name the column (or the columns) of the producer's ID"
                            .into(),
                    );
                }
                for f in o.fields() {
                    if f.is_column() {
                        continue;
                    }
                    let word = f
                        .value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_');
                    let problem = if word {
                        // A name PostgreSQL would truncate, or one starting with a digit.
                        Some(format!(
                            "`{}` is not a valid column name: {IDENTIFIER_RULE}",
                            f.value
                        ))
                    } else {
                        walfold_expr::parse(f.value).err().map(|e| {
                            format!(
                                "not a valid column name ({IDENTIFIER_RULE}) nor an expression \
                                 walfold evaluates: {e}"
                            )
                        })
                    };
                    if let Some(problem) = problem {
                        push(&format!("outbox[{i}].{}", f.name()), problem);
                    }
                }
            }
        }
        let p = &self.pipeline;
        if !(1..=100_000).contains(&p.append_batch_size) {
            push(
                "pipeline.append_batch_size",
                "must be between 1 and 100000".into(),
            );
        }
        if !(1..=1_000_000).contains(&p.channel_capacity) {
            push(
                "pipeline.channel_capacity",
                "must be between 1 and 1000000".into(),
            );
        }
        for (key, bytes, least) in [
            ("pipeline.ingest_bytes", p.ingest_bytes, 65_536),
            ("pipeline.page_bytes", p.page_bytes, 65_536),
            ("pipeline.max_event_bytes", p.max_event_bytes, 1024),
        ] {
            // PostgreSQL's own limit on one value is 1 GB.
            if !(least..=1 << 30).contains(&bytes) {
                push(
                    key,
                    format!("must be between {least} and 1073741824 (1 GiB)"),
                );
            }
        }
        if p.max_backoff_ms == 0 {
            push("pipeline.max_backoff_ms", "must be at least 1".into());
        }
        let pools = std::iter::once(("target.pool_size".to_owned(), self.target.pool_size)).chain(
            self.targets
                .iter()
                .map(|(name, t)| (format!("targets.{name}.pool_size"), t.pool_size)),
        );
        for (key, size) in pools {
            if !(1..=1000).contains(&size) {
                push(&key, "must be between 1 and 1000".into());
            }
        }
        let mut names: Vec<&str> = Vec::new();
        let mut subscribers: Vec<&str> = Vec::new();
        for (entry, proj) in projections(&self.projection, code) {
            let key = |k: &str| format!("{entry}.{k}");
            if proj.name.trim().is_empty() {
                push(&key("name"), "must not be empty".into());
            } else if names.contains(&proj.name.as_str()) {
                push(&key("name"), format!("`{}` is used twice", proj.name));
            }
            names.push(&proj.name);
            if proj.subscriber.trim().is_empty() || proj.subscriber.len() > 200 {
                push(&key("subscriber"), "must be 1-200 characters".into());
            } else if proj.subscriber == INGEST_SUBSCRIBER {
                push(
                    &key("subscriber"),
                    "`ingest` names the rows rejected before any subscriber (`walfold dead-letters list --subscriber ingest`); choose another ID".into(),
                );
            } else if subscribers.contains(&proj.subscriber.as_str()) {
                push(
                    &key("subscriber"),
                    format!(
                        "`{}` is used by two projections; each projection needs its own subscriber ID",
                        proj.subscriber
                    ),
                );
            }
            subscribers.push(&proj.subscriber);
            if proj.on_definition_change == OnDefinitionChange::Rebuild && proj.storage().is_none()
            {
                push(
                    &key("on_definition_change"),
                    "`rebuild` needs the projection's table: set `target` and write `{table}` in its sql (or use `refuse` or `accept`)".into(),
                );
            }
            match &proj.sources {
                Some(list) if list.is_empty() => push(
                    &key("sources"),
                    "is empty: the projection would apply nothing; remove the key to take every source"
                        .into(),
                ),
                Some(list) => {
                    for (j, name) in list.iter().enumerate() {
                        if list[..j].contains(name) {
                            push(&key("sources"), format!("`{name}` is listed twice"));
                        }
                    }
                }
                None => {}
            }
            for name in proj.sources.iter().flatten() {
                if !self.source.iter().any(|s| s.name == *name) {
                    push(
                        &key("sources"),
                        format!(
                            "no [[source]] is named `{name}` (sources: {})",
                            self.source_names()
                        ),
                    );
                }
            }
            if !(1..=64).contains(&proj.parallelism) {
                push(&key("parallelism"), "must be between 1 and 64".into());
            }
            if !(1..=100_000).contains(&proj.batch_size) {
                push(&key("batch_size"), "must be between 1 and 100000".into());
            }
            if proj.max_attempts == 0 {
                push(&key("max_attempts"), "must be at least 1".into());
            }
            if !(1..=100_000).contains(&proj.rebuild_batch_size) {
                push(
                    &key("rebuild_batch_size"),
                    "must be between 1 and 100000".into(),
                );
            }
            for p in &proj.unresolved {
                push(&key(&p.key), p.message.clone());
            }
        }
        if let Some(listen) = &self.metrics.listen {
            if listen.parse::<std::net::SocketAddr>().is_err() {
                push(
                    "metrics.listen",
                    format!("`{listen}` is not an address like 127.0.0.1:9187"),
                );
            }
        }
        for p in &self.retention.unresolved {
            push(&format!("retention.{}", p.key), p.message.clone());
        }
        if !(1..=1_000_000).contains(&self.retention.prune_batch_size) {
            push(
                "retention.prune_batch_size",
                "must be between 1 and 1000000".into(),
            );
        }
        self.validate_cluster(code, &mut push);
        self.validate_targets(code, &mut push);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// `[cluster]`: a lease the others can tell from a stall, and projections that exist.
    fn validate_cluster(&self, code: &[ProjectionConfig], push: &mut impl FnMut(&str, String)) {
        let cluster = &self.cluster;
        if !(3..=600).contains(&cluster.lease_s) {
            push("cluster.lease_s", "must be between 3 and 600".into());
        }
        let known: Vec<&str> = self
            .projection
            .iter()
            .chain(code)
            .map(|p| p.name.as_str())
            .collect();
        if let Some(runs) = &cluster.projections {
            for name in runs {
                if !known.contains(&name.as_str()) {
                    push(
                        "cluster.projections",
                        format!(
                            "no projection is named `{name}` (there are: {})",
                            known.join(", ")
                        ),
                    );
                }
            }
            if runs.is_empty() && !cluster.lead {
                push(
                    "cluster",
                    "with `projections = []` and `lead = false` this instance would do nothing"
                        .into(),
                );
            }
        }
    }

    /// `[targets.NAME]` and the projections' `database`: names, URLs, schemas, and
    /// that every `database` names a target.
    fn validate_targets(&self, code: &[ProjectionConfig], push: &mut impl FnMut(&str, String)) {
        for (name, t) in &self.targets {
            if !is_identifier(name) {
                push(
                    &format!("targets.{name}"),
                    format!("`{name}` is not a valid target name: {IDENTIFIER_RULE}"),
                );
            }
            check_url(push, &format!("targets.{name}.url"), &t.url);
            // Two targets on one database: on one schema their generations would run
            // twice; on two, a projection moved between them starts afresh (its claims
            // stay behind) and applies every event again to the same table.
            if t.url == self.target_url() {
                push(
                    &format!("targets.{name}.url"),
                    "names the main target's database: leave `database` out of its \
                     projections instead (a projection moved between two targets on one \
                     database would apply every event again to the same table)"
                        .into(),
                );
            } else if let Some((other, _)) = self
                .targets
                .iter()
                .take_while(|(n, _)| *n != name)
                .find(|(_, o)| o.url == t.url)
            {
                push(
                    &format!("targets.{name}.url"),
                    format!("names the same database as targets.{other}"),
                );
            }
            if !is_identifier(&t.schema) {
                push(
                    &format!("targets.{name}.schema"),
                    format!("`{}` is not a valid name: {IDENTIFIER_RULE}", t.schema),
                );
            }
        }
        for (entry, p) in projections(&self.projection, code) {
            let Some(database) = &p.database else {
                continue;
            };
            if !self.targets.contains_key(database) {
                let known: Vec<&str> = self.targets.keys().map(String::as_str).collect();
                push(
                    &format!("{entry}.database"),
                    if known.is_empty() {
                        format!(
                            "unknown target `{database}`: add [targets.{database}] with its url"
                        )
                    } else {
                        format!(
                            "unknown target `{database}`; the targets are: {}",
                            known.join(", ")
                        )
                    },
                );
            }
        }
    }
}

impl Config {
    fn source_names(&self) -> String {
        self.source
            .iter()
            .map(|s| format!("`{}`", s.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Each source on its own, and what sources must not share.
    fn validate_sources(&self, push: &mut impl FnMut(&str, String)) {
        let several = self.source.len() > 1;
        if self.source.is_empty() {
            push(
                "source",
                "missing: add a [source] with the url to follow".into(),
            );
        }
        if several && self.target.url.is_none() {
            push(
                "target.url",
                "missing: with several sources, name the database walfold writes to".into(),
            );
        }
        for (i, source) in self.source.iter().enumerate() {
            let key = |k: &str| {
                if several {
                    format!("source[{i}].{k}")
                } else {
                    format!("source.{k}")
                }
            };
            check_url(push, &key("url"), &source.url);
            if !is_identifier(&source.name) {
                push(
                    &key("name"),
                    format!("`{}` is not a valid name: {IDENTIFIER_RULE}", source.name),
                );
            } else if self.source[..i].iter().any(|s| s.name == source.name) {
                // Two without a name are both `default`.
                push(
                    &key("name"),
                    format!(
                        "`{}` is used twice: with several sources, give each its own name",
                        source.name
                    ),
                );
            }
            if !is_slot_name(&source.slot) {
                push(
                    &key("slot"),
                    format!(
                        "`{}` is not a valid slot name: 1-63 lowercase letters, digits or _ (PostgreSQL's rule for slots)",
                        source.slot
                    ),
                );
            } else if let Some(other) = self.source[..i].iter().find(|s| s.slot == source.slot) {
                push(
                    &key("slot"),
                    format!(
                        "`{}` is also the slot of source `{}`: each source needs its own slot name \
                         (the target keeps each slot's ingest position under it)",
                        source.slot, other.name
                    ),
                );
            }
            if let Some(other) = self.source[..i].iter().find(|s| s.url == source.url) {
                push(
                    &key("url"),
                    format!(
                        "is also the url of source `{}`: two sources on one database would read \
                         the same outbox twice",
                        other.name
                    ),
                );
            }
            if !is_identifier(&source.publication) {
                push(
                    &key("publication"),
                    format!(
                        "`{}` is not a valid name: {IDENTIFIER_RULE}",
                        source.publication
                    ),
                );
            }
            let outboxes = || {
                self.outbox
                    .iter()
                    .filter(|o| o.source.as_deref().is_none_or(|n| n == source.name))
            };
            if several && outboxes().next().is_none() {
                push(
                    &key("name"),
                    format!("no [[outbox]] has source = \"{}\"", source.name),
                );
            }
            if let Some(p) = source.protocol {
                if !(1..=2).contains(&p) {
                    push(
                        &key("protocol"),
                        format!("`{p}` is no pgoutput protocol walfold speaks: use 1 or 2"),
                    );
                }
                if p == 2 && outboxes().any(|o| o.message_prefix.is_some()) {
                    push(
                        &key("protocol"),
                        "2 cannot carry message outboxes: pgoutput 2 streams a transaction's \
                         messages under its top-level transaction, so a message in a savepoint \
                         rolled back after it streamed would become an event; remove \
                         the protocol key (message outboxes are read with 1) or set 1"
                            .into(),
                    );
                }
            }
        }
    }
}

/// The projections of the file (`projection[i]`) and those written in Rust
/// (`with_projection("NAME")`), each with the key its problems are reported under.
fn projections<'a>(
    file: &'a [ProjectionConfig],
    code: &'a [ProjectionConfig],
) -> impl Iterator<Item = (String, &'a ProjectionConfig)> {
    let file = file
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("projection[{i}]"), p));
    let code = code
        .iter()
        .map(|p| (format!("with_projection({:?})", p.name), p));
    file.chain(code)
}

/// A message prefix: 1-255 printable characters, not the heartbeats' own.
fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() || prefix.len() > 255 {
        return Err("must be 1-255 characters".into());
    }
    if prefix.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    if prefix.trim() != prefix {
        return Err("must not start or end with spaces (prefixes are compared exactly)".into());
    }
    if prefix == HEARTBEAT_PREFIX {
        return Err(format!(
            "`{HEARTBEAT_PREFIX}` is walfold's own heartbeat prefix"
        ));
    }
    Ok(())
}

/// A source's or target's connection string, URL or key=value pairs: see `conninfo`.
fn check_url(push: &mut impl FnMut(&str, String), key: &str, url: &str) {
    for problem in crate::conninfo::problems(url) {
        push(key, problem);
    }
}

fn is_slot_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}
