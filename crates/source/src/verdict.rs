//! What walfold makes of the source's outboxes and publication ([`Outboxes`]): what it
//! refuses, with the fix (an outbox that is no table or a partition, a column it cannot
//! read, a publication it would read wrongly), what it warns about, and what it adds.
//! Pure: `walfold run` acts on it at start and while it runs, `walfold doctor` reports
//! it.
//!
//! A publication walfold would read wrongly is refused with the fix, never worked around:
//! one that sends other tables' changes (each would stop ingest), one that filters rows
//! or columns, one that names a partitioned outbox's rows by partition.

use walfold_config::{quote_ident, OutboxConfig, QualifiedName, SourceView};

use crate::error::Refusal;
use crate::field_columns::{closest_first, field_columns, FieldColumn};
use crate::shape::{OutboxTable, Outboxes, Publication, Relation, PUBLISH};
use crate::writers::PublicEmit;

/// The configured outboxes and publication, judged.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Everything that stops walfold, in config order.
    pub refusals: Vec<Refusal>,
    /// Worth a look, not wrong (a column that differs from the config only in case).
    pub warnings: Vec<String>,
    /// Required columns the outbox tables lack now. Refused on a first start; once
    /// walfold has ingested, rows in the slot may still have them (a column renamed
    /// since), so the stream decides per transaction (`SourceError::OutboxChanged`).
    pub missing_columns: Vec<Refusal>,
    pub publication_exists: bool,
    /// Message outboxes any role can write to (`pg_logical_emit_message` executable by
    /// PUBLIC) without `allow_public_emit`: refused like [`Verdict::refusals`].
    pub public_emit: Option<Refusal>,
    /// Outboxes not yet in the existing publication (walfold adds them).
    pub unpublished: Vec<QualifiedName>,
    /// Whether the publication publishes through partition roots.
    pub via_root: bool,
    /// Outboxes that are partitioned tables.
    pub partitioned: Vec<QualifiedName>,
}

impl Verdict {
    /// Judges `outboxes` for `config`; `emit` is what the grants of
    /// `pg_logical_emit_message` mean for its message outboxes.
    pub(crate) fn of(outboxes: &Outboxes, config: &SourceView<'_>, emit: PublicEmit) -> Verdict {
        let mut v = Verdict {
            public_emit: emit.refusal,
            ..Verdict::default()
        };
        let all: Vec<&OutboxConfig> = config.outboxes().collect();
        // The table outboxes walfold follows: tables, not partitions.
        let mut followed = Vec::new();
        for t in &outboxes.tables {
            let Some(relation) = v.relation(t) else {
                continue;
            };
            v.columns(t, relation, all[t.index]);
            followed.push(t.name.clone());
        }
        v.warnings.extend(emit.warnings);
        if let Some(p) = &outboxes.publication {
            v.publication(p, config, &followed);
        }
        v
    }

    /// The outbox's relation when walfold can follow it; else the refusal is recorded.
    fn relation<'t>(&mut self, t: &'t OutboxTable) -> Option<&'t Relation> {
        let (i, name) = (t.index, &t.name);
        let refusal = match &t.relation {
            None => Refusal {
                problem: format!("outbox table {name} does not exist in the source database"),
                fix: match &t.similar {
                    Some(s) => format!(
                        "names are case-sensitive: set outbox[{i}].table = \"{}.{}\"",
                        s.schema, s.name
                    ),
                    None => "create it or fix [[outbox]] table in the config".into(),
                },
            },
            Some(Relation {
                root: Some(root), ..
            }) => Refusal {
                problem: format!("outbox table {name} is a partition of {root}"),
                fix: format!(
                    "set outbox[{i}].table = \"{root}\": walfold follows a partitioned outbox \
                     through its root, every partition included"
                ),
            },
            Some(r) if r.kind != "r" && r.kind != "p" => Refusal {
                problem: format!("outbox {name} is not a table (relkind {})", r.kind),
                fix: "logical replication publishes tables only: point [[outbox]] table at the table the application writes".into(),
            },
            Some(r) => {
                if r.kind == "p" {
                    self.partitioned.push(name.clone());
                }
                return Some(r);
            }
        };
        self.refusals.push(refusal);
        None
    }

    /// The columns the outbox's fields read, against the table's.
    fn columns(&mut self, t: &OutboxTable, relation: &Relation, outbox: &OutboxConfig) {
        let (i, name) = (t.index, &t.name);
        let names = relation.column_names();
        if outbox.set("expand").is_some() && names.contains(&crate::outbox::ELEMENT) {
            self.refusals.push(Refusal {
                problem: format!(
                    "outbox table {name} has a column `element`, and outbox[{i}].expand names \
                     each element `element` in the other fields' expressions"
                ),
                fix: "rename the column (or leave expand out): the pseudo-column would hide it"
                    .into(),
            });
        }
        for read in field_columns(outbox, &names) {
            match read.at {
                Some(at) => {
                    let type_oid = relation.columns[at].type_oid;
                    self.refusals.extend(column_type(t, &read, type_oid));
                }
                None => self.absent(t, &read, &names),
            }
        }
    }

    /// A column a field reads that the table does not have.
    fn absent(&mut self, t: &OutboxTable, read: &FieldColumn<'_>, names: &[&str]) {
        let f = &read.field;
        // Left out, and the table has no such column: the table's name.
        if f.key == "aggregate_type" && !f.set {
            return;
        }
        let (i, name, key, column) = (t.index, &t.name, f.name(), &read.column);
        let similar = names.iter().find(|c| c.eq_ignore_ascii_case(column));
        if !read.required() {
            if let Some(c) = similar {
                self.warnings.push(format!(
                    "outbox table {name} has no column `{column}` but has `{c}`: names are \
                     case-sensitive; set outbox[{i}].{key} = \"{c}\" to map it"
                ));
            }
            return;
        }
        let closest = closest_first(column, names);
        let has = format!("its columns, closest first: {}", closest.join(", "));
        let (problem, fix) = if f.is_column() {
            (
                format!("outbox table {name} has no column `{column}` (outbox[{i}].{key}); {has}"),
                match (similar, closest.first()) {
                    (Some(c), _) => {
                        format!("names are case-sensitive: set outbox[{i}].{key} = \"{c}\"")
                    }
                    (None, Some(c)) => format!(
                        "set outbox[{i}].{key} to the column that holds it (the closest: `{c}`)"
                    ),
                    (None, None) => format!("set outbox[{i}].{key} to the column that holds it"),
                },
            )
        } else {
            (
                format!(
                    "outbox table {name} has no column `{column}`, which outbox[{i}].{key} \
                     (`{}`) reads; {has}",
                    f.value
                ),
                match similar {
                    Some(c) => format!(
                        "in an expression, unquoted names fold to lower case as in \
                         PostgreSQL: quote it, \"{c}\""
                    ),
                    None => format!("fix outbox[{i}].{key}"),
                },
            )
        };
        self.missing_columns.push(Refusal { problem, fix });
    }

    /// The publication against the outboxes walfold follows (`followed`).
    fn publication(
        &mut self,
        p: &Publication,
        config: &SourceView<'_>,
        followed: &[QualifiedName],
    ) {
        self.publication_exists = true;
        self.via_root = p.via_root;
        let publication = &config.source().publication;
        let quoted_pub = quote_ident(publication);
        let create = format!(
            "create a publication of the outbox tables only (create publication ... for table ... \
             with ({PUBLISH})) and set source.publication to it, or drop {quoted_pub} and let \
             walfold create it"
        );
        if p.all_tables {
            self.refusals.push(Refusal {
                problem: format!("publication {publication} is FOR ALL TABLES: every other table's changes would stop ingest"),
                fix: create,
            });
            return;
        }
        if !p.schemas.is_empty() {
            self.refusals.push(Refusal {
                problem: format!(
                    "publication {publication} is FOR TABLES IN SCHEMA {}: other tables' changes would stop ingest",
                    p.schemas.join(", ")
                ),
                fix: create,
            });
            return;
        }
        if !p.inserts {
            self.refusals.push(Refusal {
                problem: format!("publication {publication} does not publish inserts: no outbox row would reach walfold"),
                fix: format!("alter publication {quoted_pub} set (publish = 'insert, truncate')"),
            });
        }
        self.refusals.extend(others_published(p, config));
        for m in &p.members {
            if m.filtered && followed.contains(&m.table) {
                self.refusals.push(Refusal {
                    problem: format!("publication {publication} publishes {} with a row filter or column list: rows or columns it leaves out would never reach walfold", m.table),
                    fix: format!("alter publication {quoted_pub} set table {} (add the other tables back in the same statement)", m.table.quoted()),
                });
            }
        }
        if !p.via_root && !self.partitioned.is_empty() {
            let names: Vec<String> = self.partitioned.iter().map(ToString::to_string).collect();
            self.refusals.push(Refusal {
                problem: format!(
                    "publication {publication} publishes the partitioned outbox {} under its partitions' names",
                    names.join(", ")
                ),
                fix: format!("alter publication {quoted_pub} set (publish_via_partition_root = true)"),
            });
        }
        self.unpublished = followed.iter().filter(|o| !p.has(o)).cloned().collect();
    }
}

/// A column a field reads whose type cannot serve it: a row filter's that is no boolean
/// (PostgreSQL refuses `where <text column>` before running it, so every row would be a
/// dead letter), a large object's reference.
fn column_type(t: &OutboxTable, read: &FieldColumn<'_>, type_oid: u32) -> Vec<Refusal> {
    let (i, name, column, f) = (t.index, &t.name, &read.column, &read.field);
    let key = f.name();
    let mut found = Vec::new();
    if f.key == "where" && f.is_column() && type_oid != walfold_pgoutput::oid::BOOL {
        let name_in_expr = if column.chars().any(|c| c.is_ascii_uppercase()) {
            format!("\\\"{column}\\\"")
        } else {
            column.clone()
        };
        found.push(Refusal {
            problem: format!(
                "outbox table {name} column `{column}` (outbox[{i}].where) is \
                 not boolean: every row would be a dead letter"
            ),
            fix: format!(
                "set outbox[{i}].where to a boolean column or a condition on \
                 this one, e.g. where = \"{name_in_expr} = '…'\""
            ),
        });
    }
    if let Some(why) = crate::outbox::unreadable_type(type_oid) {
        found.push(Refusal {
            problem: format!("outbox table {name} column `{column}` (outbox[{i}].{key}) {why}"),
            fix: crate::outbox::unreadable_fix(&format!("outbox[{i}].{key}")),
        });
    }
    found
}

/// The tables the publication sends that are no outbox: each of their changes would
/// stop ingest.
fn others_published(p: &Publication, config: &SourceView<'_>) -> Option<Refusal> {
    let extra: Vec<&QualifiedName> = p
        .members
        .iter()
        .map(|m| &m.table)
        .filter(|m| !config.table_outboxes().any(|(_, t)| t == **m))
        .collect();
    if extra.is_empty() {
        return None;
    }
    let publication = &config.source().publication;
    let names = extra.iter().map(ToString::to_string).collect::<Vec<_>>();
    let quoted = extra.iter().map(|m| m.quoted()).collect::<Vec<_>>();
    let (is, it) = if extra.len() == 1 {
        ("is", "it")
    } else {
        ("are", "them")
    };
    Some(Refusal {
        problem: format!(
            "publication {publication} also publishes {}, which {is} no [[outbox]]: each of their changes would stop ingest",
            names.join(", "),
        ),
        fix: format!(
            "remove {it} from it (alter publication {} drop table {}) or add {it} as [[outbox]]",
            quote_ident(publication),
            quoted.join(", "),
        ),
    })
}
