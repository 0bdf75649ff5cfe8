//! The HTTP port's TLS, as exporter-toolkit's `tls_server_config` asks for it, in rustls terms:
//! [`server_config`] turns the section into a `rustls::ServerConfig`, refusing by name what
//! rustls cannot do (TLS 1.0 and 1.1, CBC and RSA key exchange suites, P-521).
//!
//! The certificate and key are read again when either file changes on disk ([`CertFiles`]: one
//! `stat` of each per handshake), so a renewed certificate is served without a restart or a
//! SIGHUP; a pair that does not load (a key written before its certificate) keeps the last good
//! one until the next change.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::telemetry::LogLimit;

/// `client_auth_type`: Go's `tls.ClientAuthType` names, as the toolkit takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    NoClientCert,
    /// Asks for a certificate; takes the connection without one, and any certificate unverified.
    RequestClientCert,
    /// A certificate is required; any will do, unverified.
    RequireAnyClientCert,
    /// A certificate is verified against `client_ca_file` when one is sent.
    VerifyClientCertIfGiven,
    /// A certificate signed by `client_ca_file` is required: the one value that authenticates.
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    /// The toolkit's names; `RequireClientCert` is its old spelling of `RequireAnyClientCert`,
    /// and an empty value is `NoClientCert`.
    pub fn parse(name: &str) -> Option<ClientAuth> {
        Some(match name {
            "" | "NoClientCert" => ClientAuth::NoClientCert,
            "RequestClientCert" => ClientAuth::RequestClientCert,
            "RequireAnyClientCert" | "RequireClientCert" => ClientAuth::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => ClientAuth::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => ClientAuth::RequireAndVerifyClientCert,
            _ => return None,
        })
    }

    fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        )
    }
}

/// `tls_server_config`, its paths already made absolute (relative ones are the file's
/// directory's, as the toolkit reads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_auth: ClientAuth,
    pub client_ca_file: Option<PathBuf>,
    /// Go's names; empty: every suite rustls offers.
    pub cipher_suites: Vec<String>,
    /// Go's names, in the order of preference; empty: rustls's.
    pub curve_preferences: Vec<String>,
    pub min_version: String,
    pub max_version: String,
    pub prefer_server_cipher_suites: bool,
}

/// Go's names of the TLS 1.3 suites: the toolkit accepts them in `cipher_suites`, and Go
/// ignores the list for TLS 1.3 (its three suites are always on), so do we.
const TLS13_SUITES: [&str; 3] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// Suites Go (and so the toolkit) accepts that rustls does not implement: RSA key exchange and
/// CBC modes. Refused by name rather than dropped from the list without a word.
const GO_ONLY_SUITES: [&str; 8] = [
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
];

/// The versions served, in order: `min_version` and `max_version` are places in it.
static VERSIONS: [&rustls::SupportedProtocolVersion; 2] =
    [&rustls::version::TLS12, &rustls::version::TLS13];

fn version(name: &str) -> Result<usize, String> {
    match name {
        "TLS12" => Ok(0),
        "TLS13" => Ok(1),
        "TLS10" | "TLS11" => Err(format!(
            "{name} is not served: rustls speaks TLS 1.2 and 1.3 only"
        )),
        _ => Err(format!("unknown TLS version: {name}")),
    }
}

/// The ring provider, its TLS 1.2 suites and key exchange groups cut to what the section asks.
fn provider(settings: &TlsSettings) -> Result<CryptoProvider, String> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !settings.cipher_suites.is_empty() {
        let named = |s: &rustls::SupportedCipherSuite| {
            let name = s.suite().as_str();
            settings
                .cipher_suites
                .iter()
                .any(|n| name == Some(n.as_str()))
        };
        for name in &settings.cipher_suites {
            let ours = provider
                .cipher_suites
                .iter()
                .any(|s| s.suite().as_str() == Some(name.as_str()));
            if !ours && !TLS13_SUITES.contains(&name.as_str()) {
                return Err(if GO_ONLY_SUITES.contains(&name.as_str()) {
                    format!(
                        "cipher_suites: {name} is not offered by rustls (ECDHE with AES-GCM or ChaCha20 only)"
                    )
                } else {
                    format!("unknown cipher: {name}")
                });
            }
        }
        // Go's rule: the list shapes TLS 1.2; TLS 1.3's suites are always on.
        provider
            .cipher_suites
            .retain(|s| s.tls13().is_some() || named(s));
    }
    if !settings.curve_preferences.is_empty() {
        use rustls::crypto::ring::kx_group;
        let mut groups = Vec::new();
        for name in &settings.curve_preferences {
            groups.push(match name.as_str() {
                "X25519" => kx_group::X25519,
                "CurveP256" => kx_group::SECP256R1,
                "CurveP384" => kx_group::SECP384R1,
                "CurveP521" => {
                    return Err("curve_preferences: CurveP521 is not offered by rustls".into());
                }
                _ => return Err(format!("unknown curve: {name}")),
            });
        }
        provider.kx_groups = groups;
    }
    Ok(provider)
}

/// The section as a rustls server configuration, offering `alpn` (`h2`, `http/1.1`); the
/// files are read now, so a missing or mismatched one is an error before the agent starts.
pub fn server_config(
    settings: &TlsSettings,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, String> {
    let (min, max) = (
        version(&settings.min_version)?,
        version(&settings.max_version)?,
    );
    if max < min {
        return Err(format!(
            "max_version {} is below min_version {}",
            settings.max_version, settings.min_version
        ));
    }
    let versions = &VERSIONS[min..=max];
    let provider = Arc::new(provider(settings)?);
    let verifier = client_verifier(settings, &provider)?;
    let certificate = CertFiles::load(&settings.cert_file, &settings.key_file, provider.clone())?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| format!("tls_server_config: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(certificate));
    config.ignore_client_order = settings.prefer_server_cipher_suites;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

fn client_verifier(
    settings: &TlsSettings,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let auth = settings.client_auth;
    if auth == ClientAuth::NoClientCert {
        if settings.client_ca_file.is_some() {
            return Err("client CA's have been configured without a Client Auth Policy".into());
        }
        return Ok(WebPkiClientVerifier::no_client_auth());
    }
    if !auth.verifies() {
        return Ok(Arc::new(AnyClientCert {
            mandatory: auth == ClientAuth::RequireAnyClientCert,
            algorithms: provider.signature_verification_algorithms,
        }));
    }
    // Go would verify against the system's roots; public CAs vouch for no client of ours, so
    // the CA is asked for instead.
    let Some(path) = &settings.client_ca_file else {
        return Err(format!(
            "client_auth_type {auth:?} needs client_ca_file (the CA that signs the clients' certificates)"
        ));
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certificates(path)? {
        roots
            .add(cert)
            .map_err(|e| format!("client_ca_file {}: {e}", path.display()))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = match auth {
        ClientAuth::VerifyClientCertIfGiven => builder.allow_unauthenticated(),
        _ => builder,
    };
    builder
        .build()
        .map_err(|e| format!("client_ca_file {}: {e}", path.display()))
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = crate::config::read_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// `RequestClientCert` and `RequireAnyClientCert`: the client proves it holds the key of the
/// certificate it sends, and nothing else is checked (Go's meaning; the toolkit's docs call
/// both insecure for authentication).
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// What says a file changed: its inode (a renewal written beside it and renamed over it),
/// modification time and size.
type Stamp = [(u64, i64, i64, u64); 2];

fn stamp(cert: &Path, key: &Path) -> Stamp {
    [cert, key].map(|p| {
        std::fs::metadata(p).map_or((0, 0, 0, 0), |m| {
            (m.ino(), m.mtime(), m.mtime_nsec(), m.size())
        })
    })
}

/// The server's certificate and key, read again at a handshake when either file changed.
#[derive(Debug)]
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    stamp: Stamp,
    key: Arc<CertifiedKey>,
    failed_log: LogLimit,
}

impl CertFiles {
    fn load(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> Result<CertFiles, String> {
        let stamp = stamp(cert, key);
        let certified = certified_key(cert, key, &provider)?;
        Ok(CertFiles {
            cert: cert.into(),
            key: key.into(),
            provider,
            loaded: Mutex::new(Loaded {
                stamp,
                key: certified,
                failed_log: LogLimit::default(),
            }),
        })
    }
}

fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, String> {
    let chain = read_certificates(cert).map_err(|e| format!("cert_file {e}"))?;
    let private = crate::config::read_file(key)
        .map_err(|e| e.to_string())
        .and_then(|pem| PrivateKeyDer::from_pem_slice(&pem).map_err(|e| e.to_string()))
        .map_err(|e| format!("key_file {}: {e}", key.display()))?;
    CertifiedKey::from_der(chain, private, provider)
        .map(Arc::new)
        .map_err(|e| {
            format!(
                "cert_file {} with key_file {}: {e}",
                cert.display(),
                key.display()
            )
        })
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let now = stamp(&self.cert, &self.key);
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if now != loaded.stamp {
            // Taken whatever the outcome: a pair half-written fails now and loads at the
            // next change, without a failed read at every handshake meanwhile.
            loaded.stamp = now;
            match certified_key(&self.cert, &self.key, &self.provider) {
                Ok(key) => {
                    loaded.key = key;
                    tracing::info!(cert_file = %self.cert.display(), "HTTP TLS certificate read again: it changed on disk");
                }
                Err(e) => {
                    if let Some(times) = loaded.failed_log.occurred() {
                        tracing::warn!(error = %e, times, "HTTP TLS certificate changed on disk but does not load; the last good one is served");
                    }
                }
            }
        }
        Some(loaded.key.clone())
    }
}
