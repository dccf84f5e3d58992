//! `WALFOLD_…` environment overrides: `WALFOLD_SOURCE__URL`, `WALFOLD_TARGET__SCHEMA`,
//! `WALFOLD_PROJECTION__0__BATCH_SIZE`. Sections and keys are joined by `__` (keys
//! themselves contain `_`); a number selects an array entry. Variables without `__`
//! (e.g. `WALFOLD_PG_BINDIR`) are not config overrides.

use toml::{Table, Value};

use crate::error::{ConfigError, Problem};

const PREFIX: &str = "WALFOLD_";

/// Keys that hold lists: an override of an absent one is read as `a,b,c`.
const LIST_KEYS: [&str; 4] = ["event_types", "aggregate_types", "sources", "projections"];

pub(crate) fn apply_overrides(
    doc: &mut Table,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    let mut problems = Vec::new();
    let mut vars: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(k, _)| k.starts_with(PREFIX) && k.contains("__"))
        .collect();
    vars.sort();
    for (name, raw) in vars {
        let path: Vec<String> = name[PREFIX.len()..]
            .split("__")
            .map(str::to_ascii_lowercase)
            .collect();
        if let Err(message) = set(doc, &path, &raw) {
            problems.push(Problem { key: name, message });
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

fn set(table: &mut Table, path: &[String], raw: &str) -> Result<(), String> {
    let (head, rest) = path.split_first().ok_or("empty key")?;
    if head.is_empty() {
        return Err("empty key segment".into());
    }
    if rest.is_empty() {
        let existing = match table.get(head) {
            None if LIST_KEYS.contains(&head.as_str()) => Some(Value::Array(Vec::new())),
            other => other.cloned(),
        };
        let value = typed(existing.as_ref(), raw)?;
        table.insert(head.clone(), value);
        return Ok(());
    }
    let entry = table
        .entry(head.clone())
        .or_insert_with(|| Value::Table(Table::new()));
    match entry {
        Value::Table(t) => set(t, rest, raw),
        Value::Array(items) => {
            let (index, rest) = rest.split_first().ok_or("missing array index")?;
            let index: usize = index
                .parse()
                .map_err(|_| format!("`{index}` is not an index into `{head}`"))?;
            match items.get_mut(index) {
                Some(Value::Table(t)) if !rest.is_empty() => set(t, rest, raw),
                Some(_) => Err(format!("`{head}` entry {index} cannot be overridden")),
                None => Err(format!(
                    "`{head}` has no entry {index} in the config file ({} entries)",
                    items.len()
                )),
            }
        }
        _ => Err(format!("`{head}` is not a section")),
    }
}

/// Gives the override the type of the value it replaces; a new key is read as a TOML
/// literal (number, boolean, array) and otherwise as a string.
fn typed(existing: Option<&Value>, raw: &str) -> Result<Value, String> {
    let literal = || -> Option<Value> {
        let doc: Table = toml::from_str(&format!("v = {raw}")).ok()?;
        doc.get("v").cloned()
    };
    match existing {
        Some(Value::String(_)) => Ok(Value::String(raw.to_owned())),
        Some(Value::Integer(_)) => raw
            .trim()
            .parse()
            .map(Value::Integer)
            .map_err(|_| format!("`{raw}` is not an integer")),
        Some(Value::Boolean(_)) => match raw.trim() {
            "true" => Ok(Value::Boolean(true)),
            "false" => Ok(Value::Boolean(false)),
            _ => Err(format!("`{raw}` is not true or false")),
        },
        Some(Value::Array(_)) => match literal() {
            Some(v @ Value::Array(_)) => Ok(v),
            _ => Ok(Value::Array(
                raw.split(',')
                    .map(|s| Value::String(s.trim().to_owned()))
                    .collect(),
            )),
        },
        Some(_) => Err("this key cannot be overridden from the environment".into()),
        None => Ok(match literal() {
            Some(v @ (Value::Integer(_) | Value::Boolean(_) | Value::Array(_))) => v,
            _ => Value::String(raw.to_owned()),
        }),
    }
}
