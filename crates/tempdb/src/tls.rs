//! A self-signed CA and a server certificate for `localhost`/127.0.0.1, made with `openssl`;
//! and self-signed server certificates (no CA), as operators make them.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::exec::run;
use crate::Error;

const OPENSSL_CNF: &str = "\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = walfold-tempdb

[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// Paths of the generated files.
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    pub(crate) ca_cert: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
}

/// Generates `ca.crt`, `server.crt` and `server.key` (mode 0600) in `dir`.
pub(crate) fn generate(dir: &Path) -> Result<TlsFiles, Error> {
    let cnf = dir.join("openssl.cnf");
    fs::write(&cnf, OPENSSL_CNF).map_err(|e| Error::io(format!("writing {}", cnf.display()), e))?;
    let ca_key = dir.join("ca.key");
    let files = TlsFiles {
        ca_cert: dir.join("ca.crt"),
        server_cert: dir.join("server.crt"),
        server_key: dir.join("server.key"),
    };
    let csr = dir.join("server.csr");
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl()
        .args(["req", "-x509", "-config"])
        .arg(&cnf)
        .args([
            "-extensions",
            "ca_ext",
            "-days",
            "3650",
            "-subj",
            "/CN=walfold-tempdb test ca",
        ])
        .args(ec)
        .arg("-keyout")
        .arg(&ca_key)
        .arg("-out")
        .arg(&files.ca_cert)
        .run()?;
    openssl()
        .args(["req", "-new", "-config"])
        .arg(&cnf)
        .args(["-subj", "/CN=localhost"])
        .args(ec)
        .arg("-keyout")
        .arg(&files.server_key)
        .arg("-out")
        .arg(&csr)
        .run()?;
    openssl()
        .args([
            "x509",
            "-req",
            "-days",
            "3650",
            "-extensions",
            "server_ext",
            "-extfile",
        ])
        .arg(&cnf)
        .arg("-in")
        .arg(&csr)
        .arg("-CA")
        .arg(&files.ca_cert)
        .arg("-CAkey")
        .arg(&ca_key)
        .args(["-set_serial", &serial()])
        .arg("-out")
        .arg(&files.server_cert)
        .run()?;
    for key in [&ca_key, &files.server_key] {
        fs::set_permissions(key, fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod 0600 {}", key.display()), e))?;
    }
    Ok(files)
}

/// `openssl req -x509`'s own `v3_ca` section: what a self-signed certificate gets
/// from the usual configuration.
const SELF_SIGNED_CNF: &str = "\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = unused

[v3_ca]
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always,issuer
basicConstraints = critical, CA:true
";

/// A self-signed certificate for `name`, as `openssl req -x509 -newkey … -subj /CN=name
/// -addext subjectAltName=DNS:name` makes it (so with `CA:TRUE`), written to `dir`;
/// `addext` adds extensions (`extendedKeyUsage=clientAuth`). Returns the certificate's
/// and the key's (mode 0600) paths.
pub fn self_signed_cert(
    dir: &Path,
    name: &str,
    addext: &[&str],
) -> Result<(PathBuf, PathBuf), Error> {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stem = format!("self-signed-{}-{n}", std::process::id());
    let cnf = dir.join(format!("{stem}.cnf"));
    let (cert, key) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    fs::write(&cnf, SELF_SIGNED_CNF)
        .map_err(|e| Error::io(format!("writing {}", cnf.display()), e))?;
    let mut cmd = openssl();
    cmd.args(["req", "-x509", "-config"])
        .arg(&cnf)
        .args(["-extensions", "v3_ca", "-days", "3650", "-subj"])
        .arg(format!("/CN={name}"))
        .args(["-addext", &format!("subjectAltName=DNS:{name}")])
        .args([
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert);
    for ext in addext {
        cmd.args(["-addext", ext]);
    }
    cmd.run()?;
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(format!("chmod 0600 {}", key.display()), e))?;
    Ok((cert, key))
}

fn openssl() -> Command {
    let bin = Path::new("/usr/bin/openssl");
    Command::new(if bin.is_file() {
        bin
    } else {
        Path::new("openssl")
    })
}

trait RunExt {
    fn run(&mut self) -> Result<String, Error>;
}

impl RunExt for Command {
    fn run(&mut self) -> Result<String, Error> {
        run(self, "openssl")
    }
}

/// A positive serial number that differs between runs.
fn serial() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{}",
        (nanos as u64 ^ u64::from(std::process::id())) >> 1 | 1
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_a_chain_that_verifies() {
        let dir = std::env::temp_dir().join(format!("walfold-tls-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let files = generate(&dir).unwrap();
        let out = openssl()
            .arg("verify")
            .arg("-CAfile")
            .arg(&files.ca_cert)
            .args(["-verify_hostname", "localhost", "-verify_ip", "127.0.0.1"])
            .arg(&files.server_cert)
            .output()
            .unwrap();
        let mode = fs::metadata(&files.server_key)
            .unwrap()
            .permissions()
            .mode();
        fs::remove_dir_all(&dir).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn self_signed_certificates_are_cas_for_their_name() {
        let dir = std::env::temp_dir().join(format!("walfold-ss-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (cert, _) = self_signed_cert(&dir, "localhost", &[]).unwrap();
        let text = openssl()
            .args(["x509", "-noout", "-text", "-in"])
            .arg(&cert)
            .output()
            .unwrap();
        fs::remove_dir_all(&dir).unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("CA:TRUE"), "{text}");
        assert!(text.contains("DNS:localhost"), "{text}");
    }
}
