//! The tables of the configuration reference (`docs/CONFIGURATION.md`) are generated from
//! the doc comments of the serde structs in `src/model.rs` and `src/raw.rs`, so the two
//! cannot drift: each field's doc comment is its row's meaning, and its last paragraph,
//! `Default: …`, the row's default.
//! `WALFOLD_BLESS=1 cargo test -p walfold-config --test reference` rewrites the file.

use std::path::Path;

/// The reference, from the crate's directory.
const REFERENCE: &str = "../../docs/CONFIGURATION.md";

/// Section of the reference (as in its marker) → the struct whose fields are its keys.
const SECTIONS: [(&str, &str); 10] = [
    ("[source]", "SourceConfig"),
    ("[[outbox]]", "OutboxConfig"),
    ("[target]", "TargetConfig"),
    ("[targets.NAME]", "ExtraTarget"),
    ("[pipeline]", "PipelineConfig"),
    ("[retention]", "RawRetention"),
    ("[metrics]", "MetricsConfig"),
    ("[cluster]", "ClusterConfig"),
    ("[log]", "LogConfig"),
    ("[[projection]]", "RawProjection"),
];

const END: &str = "<!-- end generated -->";

/// One key: its name, its default and what it means, as the doc comment states them.
struct Row {
    key: String,
    /// The function of `#[serde(default = "defaults::…")]`, when the field names one.
    serde_default: Option<String>,
    default: String,
    meaning: String,
}

/// The fields of `struct name` in `source`, in order, with their doc comments.
fn rows(source: &str, name: &str) -> Vec<Row> {
    let start = format!("struct {name} {{");
    let mut lines = source
        .lines()
        .skip_while(|l| {
            !l.trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ")
                .starts_with(&start)
        })
        .skip(1);
    let mut rows = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    let mut serde_default = None;
    for line in lines.by_ref() {
        let line = line.trim();
        if line == "}" {
            break;
        }
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.strip_prefix(' ').unwrap_or(text));
        } else if line.starts_with("#[") {
            serde_default = line
                .split_once("default = \"defaults::")
                .and_then(|(_, f)| f.split_once('"'))
                .map(|(f, _)| f.to_owned())
                .or(serde_default);
        } else if let Some((field, _)) = line.trim_start_matches("pub ").split_once(':') {
            rows.push(Row {
                serde_default: serde_default.take(),
                ..row(field, &doc)
            });
            doc.clear();
        }
    }
    assert!(
        !rows.is_empty(),
        "no struct {name} with fields in src/model.rs or src/raw.rs"
    );
    rows
}

/// A row from a field's doc comment: paragraphs joined, the `Default: …` one apart.
fn row(field: &str, doc: &[&str]) -> Row {
    let paragraphs: Vec<String> = doc
        .split(|l| l.is_empty())
        .filter(|p| !p.is_empty())
        .map(|p| p.join(" "))
        .collect();
    let (defaults, meaning): (Vec<&String>, Vec<&String>) =
        paragraphs.iter().partition(|p| p.starts_with("Default: "));
    assert_eq!(
        defaults.len(),
        1,
        "the doc comment of `{field}` needs one last paragraph `Default: …`"
    );
    Row {
        // `r#where`: the key is `where`.
        key: field.trim_start_matches("r#").to_owned(),
        serde_default: None,
        default: defaults[0]["Default: ".len()..].to_owned(),
        meaning: meaning
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join(" "),
    }
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from("| key | default | meaning |\n|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            r.key, r.default, r.meaning
        ));
    }
    out
}

/// `reference` with every generated section rendered anew from `source`.
fn render(reference: &str, source: &str) -> String {
    let mut out = reference.to_owned();
    for (section, name) in SECTIONS {
        let marker = format!("<!-- generated: config {section} -->\n");
        let start = out
            .find(&marker)
            .unwrap_or_else(|| panic!("{REFERENCE} has no `{}`", marker.trim()))
            + marker.len();
        let end = start
            + out[start..]
                .find(END)
                .unwrap_or_else(|| panic!("{REFERENCE}: `{}` has no `{END}`", marker.trim()));
        out.replace_range(start..end, &table(&rows(source, name)));
    }
    out
}

/// The files holding the structs of [`SECTIONS`]: the shape, and the keys as written.
fn structs(dir: &Path) -> String {
    ["src/model.rs", "src/raw.rs"]
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
        .join("\n")
}

#[test]
fn the_reference_tables_are_the_doc_comments() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = structs(dir);
    let path = dir.join(REFERENCE);
    let reference = std::fs::read_to_string(&path).unwrap();
    let rendered = render(&reference, &source);
    if std::env::var_os("WALFOLD_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &rendered).unwrap();
        return;
    }
    if rendered != reference {
        let first = reference
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "docs/CONFIGURATION.md's tables differ from the doc comments in \
             crates/config/src/{{model,raw}}.rs (first at its line {}):\n  docs:      {}\n  \
             generated: {}\nEdit the doc comment, then regenerate with \
             `WALFOLD_BLESS=1 cargo test -p walfold-config --test reference`",
            first + 1,
            reference.lines().nth(first).unwrap_or(""),
            rendered.lines().nth(first).unwrap_or(""),
        );
    }
}

/// The value of the constant behind `defaults::function`, as written in `defaults.rs`.
fn constant(defaults: &str, function: &str) -> String {
    let name = defaults
        .lines()
        .find_map(|l| {
            let (f, rest) = l.trim().split_once(" -> ")?;
            let (_, name) = rest.split_once(" = ")?;
            (f == function).then(|| name.trim_end_matches(';').to_owned())
        })
        .unwrap_or_else(|| panic!("defaults.rs makes no function `{function}`"));
    defaults
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix(&format!("pub const {name}: "))?;
            Some(rest.split_once(" = ")?.1.trim_end_matches(';').to_owned())
        })
        .unwrap_or_else(|| panic!("defaults.rs has no constant `{name}`"))
}

#[test]
fn the_documented_defaults_are_the_constants() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = structs(dir);
    let defaults = std::fs::read_to_string(dir.join("src/defaults.rs")).unwrap();
    // `2_000` is `2000`, `"walfold"` is `walfold`: compare without quotes and `_`.
    let plain = |s: &str| s.replace(['`', '"', '_'], "");
    let mut checked = 0;
    for (section, name) in SECTIONS {
        for r in rows(&source, name) {
            let Some(function) = &r.serde_default else {
                continue;
            };
            let value = constant(&defaults, function);
            assert_eq!(
                plain(&r.default),
                plain(&value),
                "{section} `{}`: the doc comment says `Default: {}`, defaults.rs says {value}",
                r.key,
                r.default
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} defaults found to check");
}

#[test]
fn a_doc_comment_renders_as_one_row() {
    let source = "struct S {\n    /// first line\n    /// second.\n    ///\n    /// Default: `1`\n    #[serde(default)]\n    pub n: u32,\n}\n";
    let rows = rows(source, "S");
    assert_eq!(
        table(&rows),
        "| key | default | meaning |\n|---|---|---|\n| `n` | `1` | first line second. |\n"
    );
}
