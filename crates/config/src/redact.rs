//! Secrets never reach logs: connection URLs are printed with the password masked.

/// `postgresql://user:secret@host/db` → `postgresql://user:***@host/db`; also masks a
/// `password=` query parameter.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                let start = rest_start + colon + 1;
                out.replace_range(start..rest_start + at, "***");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let masked: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => kv.to_owned(),
            })
            .collect();
        out = format!("{head}{}", masked.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn masks_password_in_userinfo_and_query() {
        assert_eq!(
            redact_url("postgresql://app:s3cr@t@db:5432/app?sslmode=require"),
            "postgresql://app:***@db:5432/app?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://app@db/app?password=x&sslmode=disable"),
            "postgres://app@db/app?password=***&sslmode=disable"
        );
        assert_eq!(redact_url("postgres://db/app"), "postgres://db/app");
    }
}
