//! bytea: its input forms (`\x…` hex, escape), `encode`/`decode` (base64, hex,
//! escape) and `convert_from`, each following PostgreSQL's `encode.c` rules
//! (whitespace skipped in base64 and hex, `=` padding, 76-character base64 lines).

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `byteain`: `\x` followed by hex digits, else the escape form.
pub(crate) fn input(s: &str) -> Result<Vec<u8>, String> {
    match s.as_bytes() {
        [b'\\', b'x', rest @ ..] => hex_decode(rest),
        bytes => escape_decode(bytes),
    }
}

/// `decode(text, format)`.
pub(crate) fn decode(s: &str, format: &str) -> Result<Vec<u8>, String> {
    match format.to_ascii_lowercase().as_str() {
        "base64" => base64_decode(s.as_bytes()),
        "hex" => hex_decode(s.as_bytes()),
        "escape" => escape_decode(s.as_bytes()),
        _ => Err(format!("unrecognized encoding: \"{format}\"")),
    }
}

/// `encode(bytea, format)`.
pub(crate) fn encode(b: &[u8], format: &str) -> Result<String, String> {
    match format.to_ascii_lowercase().as_str() {
        "base64" => Ok(base64_encode(b)),
        "hex" => Ok(crate::datum::hex_out(b)[2..].to_owned()),
        "escape" => Ok(escape_encode(b)),
        _ => Err(format!("unrecognized encoding: \"{format}\"")),
    }
}

/// `convert_from(bytea, encoding)` for the encodings a JSON payload comes in.
pub(crate) fn convert_from(b: Vec<u8>, encoding: &str) -> Result<String, String> {
    let clean: String = encoding
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    match clean.as_str() {
        "utf8" | "unicode" => {
            if let Some(i) = b.iter().position(|x| *x == 0) {
                return Err(invalid_utf8(&b[i..]));
            }
            String::from_utf8(b).map_err(|e| {
                let at = e.utf8_error().valid_up_to();
                invalid_utf8(&e.as_bytes()[at..])
            })
        }
        "latin1" | "iso88591" => {
            if b.contains(&0) {
                return Err("invalid byte sequence for encoding \"LATIN1\": 0x00".into());
            }
            Ok(b.iter().map(|x| char::from(*x)).collect())
        }
        _ if is_known_encoding(&clean) => Err(format!(
            "convert_from from encoding \"{encoding}\" is not supported (UTF8 and LATIN1 are)"
        )),
        _ => Err(format!("invalid source encoding name \"{encoding}\"")),
    }
}

fn is_known_encoding(clean: &str) -> bool {
    clean.starts_with("latin")
        || clean.starts_with("win")
        || clean.starts_with("iso8859")
        || clean.starts_with("euc")
        || matches!(
            clean,
            "sqlascii" | "sjis" | "big5" | "gbk" | "gb18030" | "koi8r" | "koi8u" | "uhc" | "johab"
        )
}

fn invalid_utf8(rest: &[u8]) -> String {
    let shown: Vec<String> = rest.iter().take(2).map(|x| format!("0x{x:02x}")).collect();
    format!(
        "invalid byte sequence for encoding \"UTF8\": {}",
        shown.join(" ")
    )
}

fn hex_digit(c: u8) -> Result<u8, String> {
    (c as char)
        .to_digit(16)
        .map(|d| d as u8)
        .ok_or_else(|| format!("invalid hexadecimal digit: \"{}\"", c as char))
}

fn hex_decode(s: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len() / 2);
    let mut i = 0;
    while i < s.len() {
        if matches!(s[i], b' ' | b'\n' | b'\t' | b'\r') {
            i += 1;
            continue;
        }
        let hi = hex_digit(s[i])?;
        let Some(&lo) = s.get(i + 1) else {
            return Err("invalid hexadecimal data: odd number of digits".into());
        };
        out.push(hi << 4 | hex_digit(lo)?);
        i += 2;
    }
    Ok(out)
}

fn escape_decode(s: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    let octal = |c: u8| (b'0'..=b'7').contains(&c);
    while i < s.len() {
        if s[i] != b'\\' {
            out.push(s[i]);
            i += 1;
        } else if s.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else if i + 3 < s.len()
            && (b'0'..=b'3').contains(&s[i + 1])
            && octal(s[i + 2])
            && octal(s[i + 3])
        {
            out.push((s[i + 1] - b'0') << 6 | (s[i + 2] - b'0') << 3 | (s[i + 3] - b'0'));
            i += 4;
        } else {
            return Err("invalid input syntax for type bytea".into());
        }
    }
    Ok(out)
}

fn escape_encode(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for &x in b {
        if x == 0 || x >= 0x80 {
            out.push_str(&format!("\\{x:03o}"));
        } else if x == b'\\' {
            out.push_str("\\\\");
        } else {
            out.push(x as char);
        }
    }
    out
}

fn base64_encode(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() * 4 / 3 + 4);
    let mut line_end = 76;
    for chunk in b.chunks(3) {
        let n = chunk.len();
        let buf = u32::from(chunk[0]) << 16
            | u32::from(*chunk.get(1).unwrap_or(&0)) << 8
            | u32::from(*chunk.get(2).unwrap_or(&0));
        let sym = |shift: u32| B64[((buf >> shift) & 0x3f) as usize] as char;
        out.push(sym(18));
        out.push(sym(12));
        out.push(if n > 1 { sym(6) } else { '=' });
        out.push(if n > 2 { sym(0) } else { '=' });
        // PostgreSQL breaks the line once a full group reaches 76 characters,
        // even after the last group.
        if n == 3 && out.len() >= line_end {
            out.push('\n');
            line_end = out.len() + 76;
        }
    }
    out
}

fn base64_decode(s: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut buf: u32 = 0;
    let mut pos = 0;
    let mut end = 0;
    for (i, &c) in s.iter().enumerate() {
        if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        let b = if c == b'=' {
            if end == 0 {
                end = match pos {
                    2 => 1,
                    3 => 2,
                    _ => return Err("unexpected \"=\" while decoding base64 sequence".into()),
                };
            }
            0
        } else {
            match B64.iter().position(|x| *x == c) {
                Some(v) => v as u32,
                None => {
                    let ch = std::str::from_utf8(&s[i..])
                        .ok()
                        .and_then(|r| r.chars().next())
                        .map_or_else(|| format!("\\x{c:02x}"), String::from);
                    return Err(format!(
                        "invalid symbol \"{ch}\" found while decoding base64 sequence"
                    ));
                }
            }
        };
        buf = (buf << 6) + b;
        pos += 1;
        if pos == 4 {
            out.push((buf >> 16) as u8);
            if end == 0 || end > 1 {
                out.push((buf >> 8) as u8);
            }
            if end == 0 || end > 2 {
                out.push(buf as u8);
            }
            buf = 0;
            pos = 0;
        }
    }
    if pos != 0 {
        return Err("invalid base64 end sequence (the input is missing padding, is truncated, or is otherwise corrupted)".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip_and_rules() {
        assert_eq!(decode(" eyJh\nIjoxfQ== ", "BASE64").unwrap(), b"{\"a\":1}");
        assert_eq!(encode(b"{\"a\":1}", "base64").unwrap(), "eyJhIjoxfQ==");
        assert!(decode("QQ", "base64").unwrap_err().contains("end sequence"));
        assert!(decode("Q===", "base64").is_err());
        assert!(decode("QQ-=", "base64")
            .unwrap_err()
            .contains("invalid symbol \"-\""));
        let long = encode(&[b'a'; 57], "base64").unwrap();
        assert_eq!(long.len(), 77);
        assert!(long.ends_with('\n'));
    }

    #[test]
    fn hex_and_escape() {
        assert_eq!(input("\\x 41 42").unwrap(), b"AB");
        assert!(input("\\x4").is_err());
        assert!(input("\\x4g").is_err());
        assert_eq!(input("a\\\\b\\001").unwrap(), b"a\\b\x01");
        assert!(input("a\\b").is_err());
        assert_eq!(encode(b"a\\\x00\xff", "escape").unwrap(), "a\\\\\\000\\377");
        assert_eq!(encode(b"\x01\xab", "hex").unwrap(), "01ab");
        assert!(encode(b"", "base32").is_err());
    }

    #[test]
    fn convert_from_checks_utf8() {
        assert_eq!(
            convert_from(b"caf\xc3\xa9".to_vec(), "utf-8").unwrap(),
            "café"
        );
        assert!(convert_from(b"\xff".to_vec(), "UTF8")
            .unwrap_err()
            .contains("0xff"));
        assert!(convert_from(b"a\x00".to_vec(), "UTF8").is_err());
        assert_eq!(convert_from(b"\xe9".to_vec(), "LATIN1").unwrap(), "é");
        assert!(convert_from(vec![], "nope").is_err());
    }
}
