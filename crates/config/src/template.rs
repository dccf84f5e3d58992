//! SQL templates with named placeholders (`:aggregate_id`, `:payload.a.b`): compiled into
//! a statement with `$n` parameters, so event data is always bound, never spliced into SQL.

use std::collections::BTreeMap;
use std::fmt;

use crate::ident::{quote_ident, QualifiedName};

/// A value taken from an event and bound as a parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placeholder {
    /// `:event_id` (uuid)
    EventId,
    /// `:event_type` (text)
    EventType,
    /// `:aggregate_type` (text)
    AggregateType,
    /// `:aggregate_id` (text)
    AggregateId,
    /// `:version` (bigint)
    Version,
    /// `:payload` (jsonb)
    Payload,
    /// `:headers` (jsonb)
    Headers,
    /// `:payload.a.b` (text; null when missing)
    PayloadPath(Vec<String>),
    /// `:headers.a.b` (text; null when missing)
    HeadersPath(Vec<String>),
    /// `:occurred_at` (timestamptz)
    OccurredAt,
    /// `:sequence` (bigint): the event's position in the event log
    Sequence,
}

/// The PostgreSQL type a placeholder is bound as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    Uuid,
    Text,
    Int8,
    Jsonb,
    Timestamptz,
}

impl Placeholder {
    fn parse(name: &str) -> Option<Placeholder> {
        let mut parts = name.split('.');
        let head = parts.next()?;
        let path: Vec<String> = parts.map(str::to_owned).collect();
        if path.iter().any(String::is_empty) {
            return None;
        }
        Some(match (head, path.is_empty()) {
            ("event_id", true) => Placeholder::EventId,
            ("event_type", true) => Placeholder::EventType,
            ("aggregate_type", true) => Placeholder::AggregateType,
            ("aggregate_id", true) => Placeholder::AggregateId,
            ("version", true) => Placeholder::Version,
            ("payload", true) => Placeholder::Payload,
            ("headers", true) => Placeholder::Headers,
            ("payload", false) => Placeholder::PayloadPath(path),
            ("headers", false) => Placeholder::HeadersPath(path),
            ("occurred_at", true) => Placeholder::OccurredAt,
            ("sequence", true) => Placeholder::Sequence,
            _ => return None,
        })
    }

    /// How the value is bound.
    pub fn param_type(&self) -> ParamType {
        match self {
            Placeholder::EventId => ParamType::Uuid,
            Placeholder::Version | Placeholder::Sequence => ParamType::Int8,
            Placeholder::Payload | Placeholder::Headers => ParamType::Jsonb,
            Placeholder::OccurredAt => ParamType::Timestamptz,
            _ => ParamType::Text,
        }
    }
}

/// A compiled template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The statement as written, with named placeholders.
    pub source: String,
    /// The statement with `$1…$n`.
    pub sql: String,
    /// `params[i]` is bound to `$(i+1)`.
    pub params: Vec<Placeholder>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    Unknown(String),
    Unterminated(&'static str),
    Empty,
    MultipleStatements,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateError::Unknown(name) => write!(
                f,
                "unknown placeholder `:{name}`; use :event_id, :event_type, :aggregate_type, \
                 :aggregate_id, :version, :payload, :payload.a.b, :headers, :headers.a.b, \
                 :occurred_at or :sequence"
            ),
            TemplateError::Unterminated(what) => write!(f, "unterminated {what}"),
            TemplateError::Empty => write!(f, "the statement is empty"),
            TemplateError::MultipleStatements => {
                write!(f, "write one statement (use a CTE to do several things)")
            }
        }
    }
}

impl std::error::Error for TemplateError {}

impl Template {
    /// Replaces placeholders outside literals, quoted identifiers and comments with `$n`.
    /// `::type` casts are left alone; a repeated placeholder reuses its parameter.
    pub fn compile(src: &str) -> Result<Template, TemplateError> {
        Self::compile_with(src, |n| format!("${n}"))
    }

    /// Like [`Template::compile`], with `render(n)` written for the n-th (1-based)
    /// distinct placeholder instead of `$n` (e.g. a PL/pgSQL variable name).
    pub fn compile_with(
        src: &str,
        render: impl Fn(usize) -> String,
    ) -> Result<Template, TemplateError> {
        if src.trim().is_empty() {
            return Err(TemplateError::Empty);
        }
        let chars: Vec<char> = src.chars().collect();
        let mut out = String::with_capacity(src.len());
        let mut params: Vec<Placeholder> = Vec::new();
        let mut i = 0;
        let mut ended = false;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            let comment = (c == '-' && next == Some('-')) || (c == '/' && next == Some('*'));
            if ended && !c.is_whitespace() && c != ';' && !comment {
                return Err(TemplateError::MultipleStatements);
            }
            match c {
                ';' => {
                    ended = true;
                    out.push(c);
                    i += 1;
                }
                '\'' | '"' => {
                    let end = find_quote_end(&chars, i + 1, c).ok_or(
                        TemplateError::Unterminated(if c == '\'' {
                            "string literal"
                        } else {
                            "quoted identifier"
                        }),
                    )?;
                    out.extend(&chars[i..=end]);
                    i = end + 1;
                }
                '-' if next == Some('-') => {
                    let end = chars[i..]
                        .iter()
                        .position(|&c| c == '\n')
                        .map_or(chars.len(), |p| i + p);
                    out.extend(&chars[i..end]);
                    i = end;
                }
                '/' if next == Some('*') => {
                    let end = (i + 2..chars.len().saturating_sub(1))
                        .find(|&j| chars[j] == '*' && chars[j + 1] == '/')
                        .ok_or(TemplateError::Unterminated("comment"))?;
                    out.extend(&chars[i..end + 2]);
                    i = end + 2;
                }
                '$' if i == 0 || !is_word(chars[i - 1]) => {
                    // Dollar quoting: $tag$ … $tag$.
                    match dollar_tag(&chars, i) {
                        Some(tag) => {
                            let body = i + tag.len();
                            let end = find_seq(&chars, body, &tag)
                                .ok_or(TemplateError::Unterminated("dollar-quoted string"))?;
                            out.extend(&chars[i..end + tag.len()]);
                            i = end + tag.len();
                        }
                        None => {
                            out.push(c);
                            i += 1;
                        }
                    }
                }
                ':' if next == Some(':') => {
                    out.push_str("::");
                    i += 2;
                }
                ':' if next.is_some_and(|n| n.is_ascii_alphabetic() || n == '_') => {
                    let mut j = i + 1;
                    while j < chars.len()
                        && (is_word(chars[j])
                            || (chars[j] == '.' && chars.get(j + 1).is_some_and(|&n| is_word(n))))
                    {
                        j += 1;
                    }
                    let name: String = chars[i + 1..j].iter().collect();
                    let placeholder =
                        Placeholder::parse(&name).ok_or(TemplateError::Unknown(name))?;
                    let index = match params.iter().position(|p| *p == placeholder) {
                        Some(k) => k,
                        None => {
                            params.push(placeholder);
                            params.len() - 1
                        }
                    };
                    out.push_str(&render(index + 1));
                    i = j;
                }
                _ => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        Ok(Template {
            source: src.to_owned(),
            sql: out,
            params,
        })
    }
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn find_quote_end(chars: &[char], mut i: usize, quote: char) -> Option<usize> {
    while i < chars.len() {
        if chars[i] == quote {
            if chars.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return Some(i);
        }
        i += 1;
    }
    None
}

fn dollar_tag(chars: &[char], start: usize) -> Option<Vec<char>> {
    let mut j = start + 1;
    while j < chars.len() && is_word(chars[j]) {
        j += 1;
    }
    if chars.get(j) == Some(&'$') && !chars.get(start + 1).is_some_and(|c| c.is_ascii_digit()) {
        Some(chars[start..=j].to_vec())
    } else {
        None
    }
}

fn find_seq(chars: &[char], from: usize, seq: &[char]) -> Option<usize> {
    (from..=chars.len().checked_sub(seq.len())?).find(|&j| chars[j..j + seq.len()] == *seq)
}

/// The version-guarded upsert of a `table` projection: the row is inserted, or updated
/// only when its stored version is lower than the event's.
pub(crate) fn guarded_upsert(
    table: &QualifiedName,
    key: &str,
    version: &str,
    columns: &BTreeMap<String, String>,
) -> String {
    let columns: Vec<(&String, &String)> = columns
        .iter()
        .filter(|(c, _)| c.as_str() != key && c.as_str() != version)
        .collect();
    let mut names = vec![quote_ident(key), quote_ident(version)];
    let mut values = vec![":aggregate_id".to_owned(), ":version".to_owned()];
    for (col, expr) in &columns {
        names.push(quote_ident(col));
        values.push(format!("({expr})"));
    }
    let updates: Vec<String> = names[1..]
        .iter()
        .map(|n| format!("{n} = excluded.{n}"))
        .collect();
    format!(
        "insert into {table} as current_row ({names}) values ({values}) \
         on conflict ({key}) do update set {updates} \
         where current_row.{version} < excluded.{version}",
        table = table.quoted(),
        names = names.join(", "),
        values = values.join(", "),
        key = quote_ident(key),
        updates = updates.join(", "),
        version = quote_ident(version),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_parameters_and_casts_survive() {
        let t = Template::compile(
            "insert into t values (:aggregate_id, :payload.amount::numeric, ':not_me', \
             \"col:x\", :aggregate_id) -- :comment\n/* :block */ $q$ :dollar $q$",
        )
        .unwrap();
        assert_eq!(
            t.sql,
            "insert into t values ($1, $2::numeric, ':not_me', \"col:x\", $1) -- :comment\n/* :block */ $q$ :dollar $q$"
        );
        assert_eq!(
            t.params,
            vec![
                Placeholder::AggregateId,
                Placeholder::PayloadPath(vec!["amount".into()])
            ]
        );
    }

    #[test]
    fn unknown_placeholders_and_unterminated_literals_are_errors() {
        assert_eq!(
            Template::compile("select :nope"),
            Err(TemplateError::Unknown("nope".into()))
        );
        assert!(matches!(
            Template::compile("select 'abc"),
            Err(TemplateError::Unterminated(_))
        ));
        assert_eq!(Template::compile("  "), Err(TemplateError::Empty));
        assert_eq!(
            Template::compile("insert into a values (1); delete from b"),
            Err(TemplateError::MultipleStatements)
        );
        assert!(Template::compile("insert into a values (';'); -- done\n").is_ok());
    }

    #[test]
    fn guarded_upsert_has_the_version_guard() {
        let mut cols = BTreeMap::new();
        cols.insert("status".to_owned(), ":payload.status".to_owned());
        let sql = guarded_upsert(
            &QualifiedName::parse("public.order_state").unwrap(),
            "order_id",
            "version",
            &cols,
        );
        assert!(sql.contains("where current_row.\"version\" < excluded.\"version\""));
        let t = Template::compile(&sql).unwrap();
        assert_eq!(t.params.len(), 3);
    }
}
