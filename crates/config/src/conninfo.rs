//! Connection strings in both forms libpq takes: a URL (`postgresql://a:5432,b:5433/db?
//! target_session_attrs=read-write`) and key=value pairs (`host=a,b port=5432,5433
//! dbname=db target_session_attrs=read-write`). One reading of each, so the config's
//! validation, the store's SQL connections and the replication client agree on what a
//! string means, and a problem is reported at load naming its key.

/// Keys walfold accepts, in either form: what its SQL driver (tokio-postgres) takes,
/// plus `sslrootcert` (walfold's TLS reads it). Anything else (`service`, `passfile`,
/// `sslcert`) would be ignored or fail only at connect: refused at load instead.
pub const KEYS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslrootcert",
    "sslnegotiation",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

const SSL_MODES: &[&str] = &["disable", "prefer", "require", "verify-ca", "verify-full"];

/// `target_session_attrs` values walfold takes: it writes on both sides, so only a
/// server that accepts writes will do (`primary` is libpq's other name for it here).
const SESSION_ATTRS: &[&str] = &["any", "read-write", "primary"];

/// Whether `s` is the URL form (else it is read as key=value pairs).
pub fn is_url(s: &str) -> bool {
    s.starts_with("postgresql://") || s.starts_with("postgres://")
}

/// libpq's key=value form: `key = value` separated by whitespace, a value bare (a `\`
/// escapes the next character) or in single quotes (`'a value'`, `\'` and `\\` inside).
/// Errors name the key (never a value: it may be a password).
pub fn parse_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    loop {
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = it.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.next() != Some('=') {
            return Err(format!(
                "`{key}` has no `=` (key=value pairs: `host=a,b dbname=app`)"
            ));
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if it.next_if_eq(&'\'').is_some() {
            loop {
                match it.next() {
                    None => return Err(format!("`{key}`: its quoted value has no closing `'`")),
                    Some('\'') => break,
                    Some('\\') => value.extend(it.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = it.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(it.next());
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err(format!(
                    "`{key}` has no value (quote an empty one: {key}='')"
                ));
            }
        }
        out.push((key, value));
    }
}

/// Pairs as key=value text that [`parse_pairs`] reads back the same: every value quoted.
pub fn render_pairs(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One key=value conninfo per host of `s` (a URL or pairs), each `(host:port, conninfo)`
/// with everything else kept but `target_session_attrs`: to ask each server of a
/// multi-host string something (doctor: is it a standby, how is it set). `None` when
/// `s` names fewer than two hosts or cannot be read.
pub fn per_host(s: &str) -> Option<Vec<(String, String)>> {
    let pairs = if is_url(s) {
        url_pairs(s)?
    } else {
        parse_pairs(s).ok()?
    };
    let list = |key: &str| -> Vec<String> {
        pairs
            .iter()
            .rfind(|(k, _)| k == key)
            .map(|(_, v)| v.split(',').map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let (hosts, addrs, ports) = (list("host"), list("hostaddr"), list("port"));
    let n = hosts.len().max(addrs.len());
    if n < 2 {
        return None;
    }
    let rest: Vec<(String, String)> = pairs
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "host" | "hostaddr" | "port" | "target_session_attrs"
            )
        })
        .cloned()
        .collect();
    let pick = |v: &[String], i: usize| match v.len() {
        0 => None,
        1 => Some(v[0].clone()),
        _ => v.get(i).cloned(),
    };
    Some(
        (0..n)
            .map(|i| {
                let mut one = rest.clone();
                let port = pick(&ports, i)
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| "5432".into());
                let mut label = String::new();
                if let Some(h) = pick(&hosts, i) {
                    label.clone_from(&h);
                    one.push(("host".into(), h));
                }
                if let Some(a) = pick(&addrs, i) {
                    if label.is_empty() {
                        label.clone_from(&a);
                    }
                    one.push(("hostaddr".into(), a));
                }
                one.push(("port".into(), port.clone()));
                (format!("{label}:{port}"), render_pairs(&one))
            })
            .collect(),
    )
}

/// A URL as key=value pairs: `postgresql://user:pw@h1:p1,h2:p2/db?k=v` (each part
/// percent-decoded; `[::1]` hosts without their brackets).
fn url_pairs(url: &str) -> Option<Vec<(String, String)>> {
    let rest = url.split_once("://")?.1;
    let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
    let (authority, db) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hostlist) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let mut out = Vec::new();
    if let Some(u) = userinfo {
        let (user, password) = match u.split_once(':') {
            Some((user, pw)) => (user, Some(pw)),
            None => (u, None),
        };
        if !user.is_empty() {
            out.push(("user".into(), percent_decoded(user)));
        }
        if let Some(pw) = password {
            out.push(("password".into(), percent_decoded(pw)));
        }
    }
    let (mut hosts, mut ports) = (Vec::new(), Vec::new());
    for h in hostlist.split(',').filter(|h| !h.is_empty()) {
        let (host, port) = if let Some(v6) = h.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            (host, after.strip_prefix(':').unwrap_or(""))
        } else {
            h.rsplit_once(':').unwrap_or((h, ""))
        };
        hosts.push(percent_decoded(host));
        ports.push(port.to_owned());
    }
    if !hosts.is_empty() {
        out.push(("host".into(), hosts.join(",")));
        if ports.iter().any(|p| !p.is_empty()) {
            out.push(("port".into(), ports.join(",")));
        }
    }
    if !db.is_empty() {
        out.push(("dbname".into(), percent_decoded(db)));
    }
    out.extend(url_params(url));
    Some(out)
}

/// The parameters of a URL's query (`?a=1&b=2`), percent-decoded as the driver does.
fn url_params(url: &str) -> Vec<(String, String)> {
    url.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decoded(k), percent_decoded(v))
        })
        .collect()
}

/// `%41` as `A`; anything else as written.
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: Option<&u8>| c.and_then(|c| (*c as char).to_digit(16));
        match (b[i], hex(b.get(i + 1)), hex(b.get(i + 2))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What is wrong with a connection string, each problem naming its key; empty when
/// walfold can use it.
pub fn problems(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if !is_url(s) && s.contains("://") {
        return vec!["must be a URL like postgresql://user@host:5432/dbname".into()];
    }
    let pairs: Vec<(String, String)> = if is_url(s) {
        url_params(s)
    } else {
        match parse_pairs(s) {
            Ok(p) if p.is_empty() => {
                return vec![
                    "must be a URL like postgresql://user@host:5432/dbname or key=value pairs \
                     like `host=a,b port=5432 dbname=app`"
                        .into(),
                ]
            }
            Ok(p) => p,
            Err(e) => return vec![e],
        }
    };
    for (key, value) in &pairs {
        let value = value.as_str();
        match key.as_str() {
            k if !KEYS.contains(&k) => out.push(format!(
                "`{k}` is not a connection key walfold supports (in {}; it takes: {})",
                crate::redact_url(s),
                KEYS.join(", ")
            )),
            "sslmode" if !SSL_MODES.contains(&value) => out.push(format!(
                "sslmode `{value}` is not one of {}",
                SSL_MODES.join(", ")
            )),
            "target_session_attrs" if !SESSION_ATTRS.contains(&value) => out.push(format!(
                "target_session_attrs `{value}`: walfold writes, so it needs the server that \
                 accepts writes (`read-write`; several hosts choose it by themselves)"
            )),
            "port"
                if value
                    .split(',')
                    .any(|p| !p.is_empty() && !p.parse::<u16>().is_ok_and(|p| p > 0)) =>
            {
                out.push(format!(
                    "port `{value}` is not a port number (or one per host: 5432,5433)"
                ));
            }
            _ => {}
        }
    }
    if !is_url(s) {
        let count = |key: &str| {
            pairs
                .iter()
                .rfind(|(k, _)| k == key)
                .map(|(_, v)| v.split(',').count())
        };
        let hosts = count("host").or(count("hostaddr"));
        match (hosts, count("port")) {
            (None, _) => out.push(
                "`host` is missing (a name, an address or a socket directory; several for a \
                 primary and its standbys: host=a,b)"
                    .into(),
            ),
            (Some(h), Some(p)) if p != 1 && p != h => out.push(format!(
                "`port` gives {p} ports for {h} hosts: give one port for all or one per host"
            )),
            _ => {}
        }
        if let (Some(h), Some(a)) = (count("host"), count("hostaddr")) {
            if h != a {
                out.push(format!(
                    "`hostaddr` gives {a} addresses for {h} hosts: give one per host"
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: &str) -> Vec<(String, String)> {
        parse_pairs(s).unwrap()
    }

    #[test]
    fn reads_key_value_pairs_as_libpq_does() {
        assert_eq!(
            pairs("host=a,b  port = 5432,5433 dbname='my db' password='it\\'s' user=u\\ v"),
            [
                ("host", "a,b"),
                ("port", "5432,5433"),
                ("dbname", "my db"),
                ("password", "it's"),
                ("user", "u v"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert_eq!(pairs("  "), vec![]);
        assert_eq!(
            pairs("application_name=''"),
            [("application_name".into(), String::new())]
        );
        assert!(parse_pairs("host")
            .unwrap_err()
            .contains("`host` has no `=`"));
        assert!(parse_pairs("host=")
            .unwrap_err()
            .contains("`host` has no value"));
        let e = parse_pairs("password='s3cret").unwrap_err();
        assert!(e.contains("`password`") && !e.contains("s3cret"), "{e}");
    }

    #[test]
    fn rendered_pairs_read_back_the_same() {
        let p = pairs("host=/tmp,b dbname='a \\'q\\' \\\\ b' user=x");
        assert_eq!(parse_pairs(&render_pairs(&p)).unwrap(), p);
    }

    #[test]
    fn a_multi_host_string_splits_into_one_conninfo_per_host() {
        let hosts = |s: &str| {
            per_host(s).map(|v| {
                v.into_iter()
                    .map(|(label, c)| (label, parse_pairs(&c).unwrap()))
                    .collect::<Vec<_>>()
            })
        };
        let p = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            hosts("host=a,b port=5433,5434 dbname=app user=u target_session_attrs=read-write"),
            Some(vec![
                (
                    "a:5433".into(),
                    p(&[
                        ("dbname", "app"),
                        ("user", "u"),
                        ("host", "a"),
                        ("port", "5433")
                    ])
                ),
                (
                    "b:5434".into(),
                    p(&[
                        ("dbname", "app"),
                        ("user", "u"),
                        ("host", "b"),
                        ("port", "5434")
                    ])
                ),
            ])
        );
        assert_eq!(
            hosts("postgresql://u:p%40ss@a,[::1]:6000/my%20db?sslmode=disable&target_session_attrs=read-write"),
            Some(vec![
                ("a:5432".into(), p(&[("user", "u"), ("password", "p@ss"), ("dbname", "my db"), ("sslmode", "disable"), ("host", "a"), ("port", "5432")])),
                ("::1:6000".into(), p(&[("user", "u"), ("password", "p@ss"), ("dbname", "my db"), ("sslmode", "disable"), ("host", "::1"), ("port", "6000")])),
            ])
        );
        assert_eq!(hosts("postgresql://u@a/app"), None);
        assert_eq!(hosts("host=a dbname=app"), None);
    }

    #[test]
    fn problems_name_their_key() {
        let ok = [
            "host=a,b port=5432,5433 dbname=app target_session_attrs=read-write",
            "host=a port=5432 dbname=app sslmode=verify-full sslrootcert=/ca.pem",
            "hostaddr=127.0.0.1 dbname=app",
            "host=/var/run/postgresql dbname=app",
            "postgresql://a,b/app?target_session_attrs=read-write&sslmode=require",
            "postgresql://u@h/app",
            "postgresql://u@h/app?%70assword=x&sslmode=verify%2Dfull",
        ];
        for s in ok {
            assert_eq!(problems(s), Vec::<String>::new(), "{s}");
        }
        let bad = [
            ("host=a dbname=app sslmode=bogus", "sslmode `bogus`"),
            (
                "host=a,b port=1,2,3 dbname=app",
                "`port` gives 3 ports for 2 hosts",
            ),
            ("host=a port=x dbname=app", "port `x` is not a port number"),
            ("host=a servce=x", "`servce` is not a connection key"),
            ("dbname=app", "`host` is missing"),
            (
                "host=a,b target_session_attrs=read-only",
                "target_session_attrs `read-only`",
            ),
            (
                "postgresql://a/app?target_session_attrs=standby",
                "target_session_attrs",
            ),
            (
                "postgresql://a/app?sslcert=/c.pem",
                "`sslcert` is not a connection key",
            ),
            ("postgresql://a/app?sslmode=bogus", "sslmode `bogus`"),
            (
                "host=a,b hostaddr=127.0.0.1",
                "`hostaddr` gives 1 addresses for 2 hosts",
            ),
            ("", "must be a URL"),
            ("mysql://x", "must be a URL like postgresql://"),
            ("host", "`host` has no `=`"),
        ];
        for (s, want) in bad {
            let p = problems(s);
            assert!(p.iter().any(|p| p.contains(want)), "{s}: {p:?}");
        }
    }
}
