//! TLS for every connection, SQL and replication (rustls with ring): `require` encrypts
//! without verifying, `verify-ca` checks the chain, `verify-full` the chain and the host
//! name.
//!
//! A server certificate that is itself in `sslrootcert` (a self-signed one, as
//! `openssl req -x509` makes them, with `CA:TRUE`) is trusted as such, as libpq does:
//! webpki refuses a CA as the server's certificate, so that one refusal is overruled
//! for exactly those bytes, with the validity period, the name and the purpose still
//! checked.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::crypto::{ring, CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::PgError;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// A rustls client config for `mode`; `root_cert` is a PEM file (else the webpki roots).
pub fn client_config(mode: SslMode, root_cert: Option<&str>) -> Result<ClientConfig, PgError> {
    let provider = Arc::new(ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(verifier(mode, root_cert, provider)?)
        .with_no_client_auth())
}

fn verifier(
    mode: SslMode,
    root_cert: Option<&str>,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, PgError> {
    Ok(match mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => Arc::new(NoVerify {
            algorithms: provider.signature_verification_algorithms,
        }),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let (roots, pinned) = roots(root_cert)?;
            let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| PgError::RootCert {
                    path: root_cert.unwrap_or("webpki roots").to_owned(),
                    reason: e.to_string(),
                })?;
            Arc::new(ChainVerifier {
                inner,
                check_name: mode == SslMode::VerifyFull,
                pinned,
            })
        }
    })
}

/// The trust anchors, and the certificates of `sslrootcert` as they are (none for the
/// webpki roots).
fn roots(path: Option<&str>) -> Result<(RootCertStore, Vec<CertificateDer<'static>>), PgError> {
    let mut store = RootCertStore::empty();
    let Some(path) = path else {
        store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        return Ok((store, Vec::new()));
    };
    let err = |reason: String| PgError::RootCert {
        path: path.to_owned(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no certificates in file".into()));
    }
    for cert in &certs {
        store.add(cert.clone()).map_err(|e| err(e.to_string()))?;
    }
    Ok((store, certs))
}

/// `require`: the channel is encrypted, the peer is not authenticated (libpq semantics).
#[derive(Debug)]
struct NoVerify {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `verify-ca` / `verify-full`: the chain must lead to a trusted root; the host name
/// is checked only for `verify-full`.
#[derive(Debug)]
struct ChainVerifier {
    inner: Arc<WebPkiServerVerifier>,
    check_name: bool,
    /// The certificates of `sslrootcert`, byte for byte.
    pinned: Vec<CertificateDer<'static>>,
}

impl ChainVerifier {
    /// A server certificate that is one of `sslrootcert`'s and that webpki refused only
    /// because it is a CA: trusted as itself if valid for this name and for a server.
    /// webpki checks the validity period before the CA flag, so a pinned certificate
    /// that expired is refused as expired before this (see the tests).
    fn verify_pinned(
        &self,
        end_entity: &CertificateDer<'_>,
        server_name: &ServerName<'_>,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if !server_auth_allowed(end_entity) {
            return Err(rustls::CertificateError::InvalidPurpose.into());
        }
        if self.check_name {
            verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
        }
        Ok(ServerCertVerified::assertion())
    }
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext, Other};
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(NotValidForName))
            | Err(rustls::Error::InvalidCertificate(NotValidForNameContext { .. }))
                if !self.check_name =>
            {
                Ok(ServerCertVerified::assertion())
            }
            Err(rustls::Error::InvalidCertificate(Other(e)))
                if matches!(
                    e.0.downcast_ref::<webpki::Error>(),
                    Some(webpki::Error::CaUsedAsEndEntity)
                ) && self
                    .pinned
                    .iter()
                    .any(|p| p.as_ref() == end_entity.as_ref()) =>
            {
                self.verify_pinned(end_entity, server_name)
            }
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Whether a certificate may serve TLS: no extended key usage, or one that lists
/// `serverAuth` (what webpki checks after the CA flag, so never for a pinned one).
/// Read from the DER of a certificate the operator trusts (it is byte for byte one of
/// `sslrootcert`'s); anything unexpected in it answers no.
fn server_auth_allowed(cert: &[u8]) -> bool {
    const EXTENDED_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25];
    const SERVER_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01];
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { …, [3] extensions }, … }
    let Some((0x30, cert, _)) = der(cert) else {
        return false;
    };
    let Some((0x30, mut tbs, _)) = der(cert) else {
        return false;
    };
    while let Some((tag, value, rest)) = der(tbs) {
        tbs = rest;
        if tag != 0xa3 {
            continue;
        }
        // Extension ::= SEQUENCE { extnID OID, critical BOOLEAN OPTIONAL, extnValue OCTET STRING }
        let Some((0x30, mut extensions, _)) = der(value) else {
            return false;
        };
        while let Some((tag, extension, rest)) = der(extensions) {
            extensions = rest;
            let Some((0x06, EXTENDED_KEY_USAGE, mut fields)) =
                (tag == 0x30).then(|| der(extension)).flatten()
            else {
                continue;
            };
            if let Some((0x01, _, rest)) = der(fields) {
                fields = rest;
            }
            let Some((0x04, octets, _)) = der(fields) else {
                return false;
            };
            let Some((0x30, mut purposes, _)) = der(octets) else {
                return false;
            };
            while let Some((0x06, purpose, rest)) = der(purposes) {
                if purpose == SERVER_AUTH {
                    return true;
                }
                purposes = rest;
            }
            return false;
        }
    }
    true
}

/// The first DER element of `input`: its tag, its contents and what follows it.
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        0..=0x7f => (usize::from(first), rest),
        0x81..=0x84 => {
            let (bytes, rest) = rest.split_at_checked(usize::from(first & 0x7f))?;
            let len = bytes
                .iter()
                .fold(0usize, |len, &b| (len << 8) | usize::from(b));
            (len, rest)
        }
        _ => return None,
    };
    let (contents, rest) = rest.split_at_checked(len)?;
    Some((tag, contents, rest))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::*;

    /// Certificates made by `openssl` in a directory removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new() -> Dir {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("walfold-tls-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Dir(dir)
        }

        /// A self-signed certificate (`CA:TRUE`) for `name`.
        fn self_signed(&self, name: &str, addext: &[&str]) -> PathBuf {
            walfold_tempdb::self_signed_cert(&self.0, name, addext)
                .unwrap()
                .0
        }

        /// One PEM file holding `certs`.
        fn bundle(&self, certs: &[&Path]) -> PathBuf {
            let path = self.0.join(format!("bundle-{}.pem", certs.len()));
            let text: String = certs
                .iter()
                .map(|c| std::fs::read_to_string(c).unwrap())
                .collect();
            std::fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn years_from_now(years: i64) -> UnixTime {
        let now = UnixTime::now().as_secs() as i64;
        UnixTime::since_unix_epoch(Duration::from_secs((now + years * 365 * 86_400) as u64))
    }

    /// Verifies `served` as the server's certificate for `name`, trusting `root`.
    fn verify(
        mode: SslMode,
        root: Option<&Path>,
        served: &Path,
        name: &str,
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let v = verifier(
            mode,
            root.map(|r| r.to_str().unwrap()),
            Arc::new(ring::default_provider()),
        )
        .unwrap();
        let cert = CertificateDer::from_pem_file(served).unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        v.verify_server_cert(&cert, &[], &name, &[], now)
    }

    #[test]
    fn a_self_signed_certificate_in_sslrootcert_verifies_for_its_name_only() {
        let dir = Dir::new();
        let cert = dir.self_signed("localhost", &[]);
        let full = |name: &str| {
            verify(
                SslMode::VerifyFull,
                Some(&cert),
                &cert,
                name,
                UnixTime::now(),
            )
        };
        assert!(full("localhost").is_ok(), "{:?}", full("localhost"));
        for other in ["db.example", "127.0.0.1"] {
            assert!(
                matches!(
                    full(other),
                    Err(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::NotValidForNameContext { .. }
                            | rustls::CertificateError::NotValidForName
                    ))
                ),
                "{other}: {:?}",
                full(other)
            );
        }
        // verify-ca checks the certificate, not the name.
        assert!(verify(
            SslMode::VerifyCa,
            Some(&cert),
            &cert,
            "db.example",
            UnixTime::now()
        )
        .is_ok());
        // Among other roots, too.
        let other = dir.self_signed("localhost", &[]);
        let both = dir.bundle(&[&other, &cert]);
        assert!(verify(
            SslMode::VerifyFull,
            Some(&both),
            &cert,
            "localhost",
            UnixTime::now()
        )
        .is_ok());
    }

    #[test]
    fn a_self_signed_certificate_not_in_sslrootcert_is_refused() {
        let dir = Dir::new();
        let served = dir.self_signed("localhost", &[]);
        let root = dir.self_signed("localhost", &[]);
        for mode in [SslMode::VerifyFull, SslMode::VerifyCa] {
            assert!(verify(mode, Some(&root), &served, "localhost", UnixTime::now()).is_err());
            assert!(verify(mode, None, &served, "localhost", UnixTime::now()).is_err());
        }
    }

    #[test]
    fn a_pinned_certificate_out_of_its_validity_is_refused() {
        let dir = Dir::new();
        let cert = dir.self_signed("localhost", &[]);
        for (when, years) in [("expired", 11), ("not yet valid", -1)] {
            let result = verify(
                SslMode::VerifyFull,
                Some(&cert),
                &cert,
                "localhost",
                years_from_now(years),
            );
            assert!(
                matches!(
                    result,
                    Err(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::ExpiredContext { .. }
                            | rustls::CertificateError::NotValidYetContext { .. }
                    ))
                ),
                "{when}: {result:?}"
            );
        }
    }

    #[test]
    fn a_pinned_certificate_must_be_for_servers() {
        let dir = Dir::new();
        let client = dir.self_signed("localhost", &["extendedKeyUsage=clientAuth"]);
        let result = verify(
            SslMode::VerifyFull,
            Some(&client),
            &client,
            "localhost",
            UnixTime::now(),
        );
        assert!(
            matches!(
                result,
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::InvalidPurpose
                ))
            ),
            "{result:?}"
        );
        let server = dir.self_signed("localhost", &["extendedKeyUsage=clientAuth,serverAuth"]);
        assert!(verify(
            SslMode::VerifyFull,
            Some(&server),
            &server,
            "localhost",
            UnixTime::now()
        )
        .is_ok());
    }

    #[test]
    fn reads_no_purpose_from_what_is_not_a_certificate() {
        for bytes in [
            &[][..],
            &[0x30],
            &[0x30, 0x85, 0, 0, 0, 0, 1],
            &[0x30, 0x03, 0x30, 0x01],
        ] {
            assert!(!server_auth_allowed(bytes), "{bytes:?}");
        }
    }
}
