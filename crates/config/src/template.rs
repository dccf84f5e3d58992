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
    /// `:source` (text): the name of the `[[source]]` the event came from
    Source,
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
            ("source", true) => Placeholder::Source,
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
                 :occurred_at, :sequence or :source"
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
        let mut out = String::with_capacity(src.len());
        let mut params: Vec<Placeholder> = Vec::new();
        let mut ended = false;
        for (kind, text) in segments(src)? {
            match kind {
                Segment::Comment => out.push_str(&text),
                Segment::Quoted if ended => return Err(TemplateError::MultipleStatements),
                Segment::Quoted => out.push_str(&text),
                Segment::Code => {
                    let chars: Vec<char> = text.chars().collect();
                    let mut i = 0;
                    while i < chars.len() {
                        let c = chars[i];
                        let next = chars.get(i + 1).copied();
                        if ended && !c.is_whitespace() && c != ';' {
                            return Err(TemplateError::MultipleStatements);
                        }
                        match c {
                            ';' => {
                                ended = true;
                                out.push(c);
                                i += 1;
                            }
                            ':' if next == Some(':') => {
                                out.push_str("::");
                                i += 2;
                            }
                            ':' if next.is_some_and(|n| n.is_ascii_alphabetic() || n == '_') => {
                                let mut j = i + 1;
                                while j < chars.len()
                                    && (is_word(chars[j])
                                        || (chars[j] == '.'
                                            && chars.get(j + 1).is_some_and(|&n| is_word(n))))
                                {
                                    j += 1;
                                }
                                let name: String = chars[i + 1..j].iter().collect();
                                let placeholder = Placeholder::parse(&name)
                                    .ok_or(TemplateError::Unknown(name))?;
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
                }
            }
        }
        Ok(Template {
            source: src.to_owned(),
            sql: out,
            params,
        })
    }

    /// `src` with `from` replaced by `to` in its SQL code only, never inside a string
    /// literal, a quoted identifier or a comment (how `{table}` becomes the table name).
    pub fn replace_in_code(src: &str, from: &str, to: &str) -> Result<String, TemplateError> {
        Ok(segments(src)?
            .into_iter()
            .map(|(kind, text)| match kind {
                Segment::Code => text.replace(from, to),
                Segment::Quoted | Segment::Comment => text,
            })
            .collect())
    }
}

/// What a piece of a statement is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment {
    /// SQL code: where placeholders and `{table}` are.
    Code,
    /// A string literal (`'…'`, `E'…'` with backslash escapes, `$tag$…$tag$`) or a
    /// quoted identifier.
    Quoted,
    /// `-- …` or `/* … */` (nested, as PostgreSQL reads them).
    Comment,
}

/// Splits a statement into code, quoted text and comments, as PostgreSQL's lexer would.
fn segments(src: &str) -> Result<Vec<(Segment, String)>, TemplateError> {
    let chars: Vec<char> = src.chars().collect();
    let mut out: Vec<(Segment, String)> = Vec::new();
    let mut code = String::new();
    let push = |out: &mut Vec<(Segment, String)>, code: &mut String, kind, text: &[char]| {
        if !code.is_empty() {
            out.push((Segment::Code, std::mem::take(code)));
        }
        out.push((kind, text.iter().collect()));
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '\'' | '"' => {
                // E'…' (or e'…'): backslash escapes, so \' does not end it.
                let escapes = c == '\''
                    && i > 0
                    && matches!(chars[i - 1], 'E' | 'e')
                    && (i < 2 || !is_word(chars[i - 2]));
                let end = find_quote_end(&chars, i + 1, c, escapes).ok_or(
                    TemplateError::Unterminated(if c == '\'' {
                        "string literal"
                    } else {
                        "quoted identifier"
                    }),
                )?;
                if escapes {
                    // The E prefix belongs to the literal.
                    code.pop();
                    push(&mut out, &mut code, Segment::Quoted, &chars[i - 1..=end]);
                } else {
                    push(&mut out, &mut code, Segment::Quoted, &chars[i..=end]);
                }
                i = end + 1;
            }
            '-' if next == Some('-') => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '\n')
                    .map_or(chars.len(), |p| i + p);
                push(&mut out, &mut code, Segment::Comment, &chars[i..end]);
                i = end;
            }
            '/' if next == Some('*') => {
                let end =
                    block_comment_end(&chars, i).ok_or(TemplateError::Unterminated("comment"))?;
                push(&mut out, &mut code, Segment::Comment, &chars[i..end]);
                i = end;
            }
            '$' if i == 0 || !is_word(chars[i - 1]) => match dollar_tag(&chars, i) {
                Some(tag) => {
                    let body = i + tag.len();
                    let end = find_seq(&chars, body, &tag)
                        .ok_or(TemplateError::Unterminated("dollar-quoted string"))?;
                    push(
                        &mut out,
                        &mut code,
                        Segment::Quoted,
                        &chars[i..end + tag.len()],
                    );
                    i = end + tag.len();
                }
                None => {
                    code.push(c);
                    i += 1;
                }
            },
            _ => {
                code.push(c);
                i += 1;
            }
        }
    }
    if !code.is_empty() {
        out.push((Segment::Code, code));
    }
    Ok(out)
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The closing quote's index; a doubled quote is part of the text, and with `escapes`
/// so is any character after a backslash.
fn find_quote_end(chars: &[char], mut i: usize, quote: char, escapes: bool) -> Option<usize> {
    while i < chars.len() {
        if escapes && chars[i] == '\\' {
            i += 2;
            continue;
        }
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

/// The index just past a block comment starting at `start` (they nest in PostgreSQL).
fn block_comment_end(chars: &[char], start: usize) -> Option<usize> {
    let mut depth = 0;
    let mut i = start;
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => {
                depth += 1;
                i += 2;
            }
            ('*', '/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => i += 1,
        }
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

/// A table projection's guarded upsert, in parts: the columns it writes (key and version
/// first), the value written to each (with placeholders), and the conflict clause with the
/// version guard. One event's statement and a whole round's are assembled from them.
#[derive(Debug, Clone)]
pub struct Upsert {
    /// The table, quoted.
    pub table: String,
    /// The key column, quoted.
    pub key: String,
    /// The key column as named.
    pub key_column: String,
    /// The columns written, quoted: the key, the version, then the configured columns.
    pub names: Vec<String>,
    /// The value of each column, in the same order.
    pub values: Vec<String>,
    /// `on conflict (key) do update set … where current_row.version < excluded.version`
    pub conflict: String,
}

impl Upsert {
    pub fn new(
        table: &QualifiedName,
        key: &str,
        version: &str,
        columns: &BTreeMap<String, String>,
    ) -> Upsert {
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
        let conflict = format!(
            "on conflict ({key}) do update set {updates} where current_row.{version} < excluded.{version}",
            key = quote_ident(key),
            updates = updates.join(", "),
            version = quote_ident(version),
        );
        Upsert {
            table: table.quoted(),
            key: quote_ident(key),
            key_column: key.to_owned(),
            names,
            values,
            conflict,
        }
    }

    /// The statement for one event.
    pub fn one(&self) -> String {
        format!(
            "insert into {} as current_row ({}) values ({}) {}",
            self.table,
            self.names.join(", "),
            self.values.join(", "),
            self.conflict
        )
    }
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
    fn escape_strings_nested_comments_and_table_names_are_read_as_postgresql_does() {
        // In E'…' a backslash escapes the quote: the literal runs to the last quote.
        let t = Template::compile(r"select E'it\'s :not_me' || e'\\' || :event_type").unwrap();
        assert_eq!(t.sql, r"select E'it\'s :not_me' || e'\\' || $1");
        assert_eq!(t.params, vec![Placeholder::EventType]);
        // Not an escape string: `xE'…'` is an identifier followed by a literal.
        let t = Template::compile(r"select colE'a\' , :version").unwrap();
        assert_eq!(t.sql, r"select colE'a\' , $1");
        let t = Template::compile("select /* a /* nested :x */ still */ :version").unwrap();
        assert_eq!(t.sql, "select /* a /* nested :x */ still */ $1");
        let sql = Template::replace_in_code(
            "insert into {table} values ('{table}', \"{table}\") -- {table}\n/* {table} */",
            "{table}",
            "\"public\".\"t\"",
        )
        .unwrap();
        assert_eq!(
            sql,
            "insert into \"public\".\"t\" values ('{table}', \"{table}\") -- {table}\n/* {table} */"
        );
    }

    #[test]
    fn guarded_upsert_has_the_version_guard() {
        let mut cols = BTreeMap::new();
        cols.insert("status".to_owned(), ":payload.status".to_owned());
        let sql = Upsert::new(
            &QualifiedName::parse("public.order_state").unwrap(),
            "order_id",
            "version",
            &cols,
        )
        .one();
        assert!(sql.contains("where current_row.\"version\" < excluded.\"version\""));
        let t = Template::compile(&sql).unwrap();
        assert_eq!(t.params.len(), 3);
    }
}
