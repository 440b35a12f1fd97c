//! TLS for every port and client: PEM files loaded into rustls configs
//! (the HTTPS listener, the Raft transport's mutual TLS, the HTTPS clients
//! of agents, followers and the CLI, agents' HTTPS checks), and `cairn tls`'
//! CA and certificate generation with Consul's file names and SANs.
//!
//! The Raft transport checks a peer against the CA and
//! `server.<dc>.<domain>`: when dialing, the datacenter dialed; on the
//! port, any datacenter's server, with `Certified` saying which. Agents'
//! HTTPS checks take `TLSSkipVerify` and `TLSServerName`. Certificates are
//! made with rcgen.
//!
//! rustls with the ring provider only (no OpenSSL, no aws-lc: its C build
//! is long); keys are EC P-256, as `consul tls` makes them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: no certificate in it (PEM expected)")]
    NoCert { path: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} exists already")]
    Exists(String),
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("certificate: {0}")]
    Gen(#[from] rcgen::Error),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, TlsError>;

/// The crypto every config here uses: ring's.
pub fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Makes ring the process's default provider. reqwest is built with
/// rustls but without a provider of its own (its own is aws-lc, a long C
/// build): building any reqwest client, even for plain HTTP, panics unless
/// this ran first in the process. Idempotent and cheap: call it before
/// building one.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A reqwest client builder that cannot panic for want of a provider: the
/// one way this crate and its tests start building an HTTP client.
pub fn http_client() -> reqwest::ClientBuilder {
    install_default_provider();
    reqwest::Client::builder()
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

/// Every certificate in a PEM file, in order (a chain: leaf first).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let read_err = |e: rustls_pki_types::pem::Error| TlsError::Read {
        path: display(path),
        reason: e.to_string(),
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read_err)?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(read_err)?;
    if certs.is_empty() {
        return Err(TlsError::NoCert {
            path: display(path),
        });
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, SEC1 or PKCS#1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Read {
        path: display(path),
        reason: e.to_string(),
    })
}

/// The CA file's certificates as trust roots.
pub fn load_roots(path: &Path) -> Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(path)? {
        roots
            .add(c)
            .map_err(|e| TlsError::Invalid(format!("{}: {e}", display(path))))?;
    }
    Ok(Arc::new(roots))
}

/// The name a server's certificate must carry: `server.<dc>.<domain>`
/// (Consul's `verify_server_hostname`): a server dialing another checks it
/// for the datacenter it dials, its own or another one's.
pub fn server_name(datacenter: &str, domain: &str) -> String {
    format!("server.{datacenter}.{domain}")
}

/// The TLS domain of a DNS domain (`--domain`, `consul.`): no trailing
/// dot, lower case, as certificates spell names.
pub fn tls_domain(dns_domain: &str) -> String {
    dns_domain.trim_end_matches('.').to_ascii_lowercase()
}

/// The datacenters a certificate names its holder a server of: each DNS
/// SAN `server.<dc>.<domain>` (`dc` one label). Only read, not verified:
/// the verifiers below check each name against the CA before a peer is
/// believed.
pub fn server_datacenters(cert: &CertificateDer<'_>, domain: &str) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    let suffix = format!(".{}", domain.to_ascii_lowercase());
    let mut out: Vec<String> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => {
                let d = d.to_ascii_lowercase();
                let dc = d.strip_prefix("server.")?.strip_suffix(suffix.as_str())?;
                (!dc.is_empty() && !dc.contains('.')).then(|| dc.to_string())
            }
            _ => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What a server's certificate proved in a handshake on the Raft port:
/// the datacenters it is a server of (every one checked against the CA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certified {
    pub datacenters: Vec<String>,
    /// One of them is this server's own.
    pub local: bool,
}

impl Certified {
    pub fn of(cert: &CertificateDer<'_>, local_dc: &str, domain: &str) -> Certified {
        let datacenters = server_datacenters(cert, domain);
        let local = datacenters.iter().any(|d| d == local_dc);
        Certified { datacenters, local }
    }

    /// Whether it names a server of `dc`.
    pub fn serves(&self, dc: &str) -> bool {
        self.datacenters.iter().any(|d| d == dc)
    }
}

/// Verifies a peer's chain with `verifier` for each server name its
/// leaf claims: at least one, and every one (a name the CA may not vouch
/// for, by its name constraints, refuses the certificate).
fn verify_server_names(
    verifier: &WebPkiServerVerifier, end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>], domain: &str, now: UnixTime,
) -> std::result::Result<(), rustls::Error> {
    let dcs = server_datacenters(end_entity, domain);
    if dcs.is_empty() {
        return Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName,
        ));
    }
    for dc in dcs {
        let name = ServerName::try_from(server_name(&dc, domain)).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
        })?;
        verifier.verify_server_cert(end_entity, intermediates, &name, &[], now)?;
    }
    Ok(())
}

/// A server's (or agent's) TLS files, loaded: the CA it trusts and its own
/// certificate and key.
pub struct Tls {
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field("certs", &self.chain.len())
            .finish()
    }
}

impl Tls {
    /// Loads the three files and checks that the key matches the
    /// certificate (a mismatch would only show at the first handshake).
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> Result<Tls> {
        let tls = Tls {
            roots: load_roots(ca)?,
            chain: load_certs(cert)?,
            key: load_key(key)?,
        };
        // Building a server config checks the pair.
        ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(tls.chain.clone(), tls.key.clone_key())
            .map_err(|e| {
                TlsError::Invalid(format!(
                    "{} and {} do not make a pair: {e}",
                    display(cert),
                    display(key)
                ))
            })?;
        Ok(tls)
    }

    /// The HTTPS listener's config: with `verify_incoming`, a client must
    /// present a certificate signed by the CA.
    pub fn https_server(&self, verify_incoming: bool) -> Result<Arc<ServerConfig>> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = if verify_incoming {
            let v = WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider())
                .build()
                .map_err(|e| TlsError::Invalid(e.to_string()))?;
            builder.with_client_cert_verifier(v)
        } else {
            builder.with_no_client_auth()
        };
        let mut c = builder.with_single_cert(self.chain.clone(), self.key.clone_key())?;
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(c))
    }

    /// The Raft port's config: the peer must present a certificate signed
    /// by the CA for `server.<dc>.<domain>`, for any datacenter: servers of
    /// other datacenters greet this one on the same port. Which datacenter
    /// it proved is the frames' business (`raft::secure`, `Certified`):
    /// Raft's own only from this one's, a datacenter's greeting only from
    /// its servers.
    pub fn raft_server(&self, domain: &str) -> Result<Arc<ServerConfig>> {
        let verifier = PeerServerVerifier::new(self.roots.clone(), domain)?;
        let c = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(Arc::new(verifier))
            .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        Ok(Arc::new(c))
    }

    /// A client config trusting the CA and presenting this certificate:
    /// the Raft transport's (connect with [`server_name`]), a follower's
    /// forwarding, a server's own agent.
    pub fn client(&self) -> Result<ClientConfig> {
        Ok(ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())?)
    }

    /// The Raft transport's client config for a server whose datacenter is
    /// not known yet (a `--join-wan` address): any `server.<dc>.<domain>`
    /// of the CA; the datacenter it proved must then be the one it says
    /// it is (`Certified`, checked by `federation`).
    pub fn client_any_server(&self, domain: &str) -> Result<ClientConfig> {
        let verifier = AnyServerVerifier {
            inner: WebPkiServerVerifier::builder_with_provider(self.roots.clone(), provider())
                .build()
                .map_err(|e| TlsError::Invalid(e.to_string()))?,
            domain: domain.to_string(),
        };
        Ok(ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())?)
    }
}

/// A client config for talking HTTPS to servers: trusting `ca`, presenting
/// `cert`/`key` if given (agents and the CLI).
pub fn client_config(ca: &Path, cert_key: Option<(&Path, &Path)>) -> Result<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(load_roots(ca)?);
    Ok(match cert_key {
        Some((cert, key)) => builder.with_client_auth_cert(load_certs(cert)?, load_key(key)?)?,
        None => builder.with_no_client_auth(),
    })
}

/// An HTTPS check's client config: the system's roots (or none at all with
/// `skip_verify`, Consul's `TLSSkipVerify`), and with `server_name` the
/// certificate is checked against that name instead of the URL's host
/// (Consul's `TLSServerName`).
pub fn check_client_config(skip_verify: bool, server_name: Option<&str>) -> Result<ClientConfig> {
    let builder =
        ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let verifier: Arc<dyn ServerCertVerifier> = if skip_verify {
        Arc::new(NoVerify)
    } else {
        let roots = system_roots();
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| TlsError::Invalid(e.to_string()))?;
        match server_name {
            Some(n) if !n.is_empty() => Arc::new(NamedVerifier {
                inner,
                name: ServerName::try_from(n.to_string())
                    .map_err(|e| TlsError::Invalid(format!("TLSServerName {n:?}: {e}")))?,
            }),
            _ => inner,
        }
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// A client that trusts the CA certificates of `ca_pem` (an auth method's
/// `JWKSCACert`, `CACert`...), or the system's roots when none is given.
pub fn ca_client_config(ca_pem: Option<&str>) -> Result<ClientConfig> {
    let roots = match ca_pem.filter(|p| !p.trim().is_empty()) {
        None => system_roots(),
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let c = c.map_err(|e| TlsError::Invalid(format!("CA certificate: {e}")))?;
                roots
                    .add(c)
                    .map_err(|e| TlsError::Invalid(format!("CA certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(TlsError::Invalid("no CA certificate in the PEM".into()));
            }
            Arc::new(roots)
        }
    };
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The system's trust roots (Debian's bundle), read once; empty if none.
fn system_roots() -> Arc<RootCertStore> {
    static R: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    R.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        for f in [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
        ] {
            if let Ok(certs) = load_certs(Path::new(f)) {
                roots.add_parsable_certificates(certs);
                break;
            }
        }
        Arc::new(roots)
    })
    .clone()
}

/// The handshake-signature half of a certificate verifier. Every verifier
/// here checks the peer's handshake signatures the same way, with the ring
/// provider's algorithms, whatever it decides about the certificate.
macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &provider().signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &provider().signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}

/// Verifies against a fixed name whatever name the connection used.
#[derive(Debug)]
struct NamedVerifier {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for NamedVerifier {
    fn verify_server_cert(
        &self, end_entity: &CertificateDer<'_>, intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>, ocsp: &[u8], now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp, now)
    }

    handshake_signatures!();
}

/// Accepts any certificate (the handshake's signatures are still checked,
/// so the session is at least with the key holder): `TLSSkipVerify`.
#[derive(Debug)]
struct NoVerify;

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self, _end_entity: &CertificateDer<'_>, _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>, _ocsp: &[u8], _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

/// A server of any datacenter, dialed before its datacenter is known.
#[derive(Debug)]
struct AnyServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
    domain: String,
}

impl ServerCertVerifier for AnyServerVerifier {
    fn verify_server_cert(
        &self, end_entity: &CertificateDer<'_>, intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>, _ocsp: &[u8], now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        verify_server_names(&self.inner, end_entity, intermediates, &self.domain, now)?;
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

/// The Raft port's check of a connecting peer: a client certificate
/// signed by the CA (mandatory) that is also valid as the certificate of
/// `server.<dc>.<domain>` for some datacenter, so a client agent's
/// certificate from the same CA cannot join or greet.
#[derive(Debug)]
struct PeerServerVerifier {
    client: Arc<dyn ClientCertVerifier>,
    server: Arc<WebPkiServerVerifier>,
    domain: String,
}

impl PeerServerVerifier {
    fn new(roots: Arc<RootCertStore>, domain: &str) -> Result<Self> {
        let invalid = |e: rustls::server::VerifierBuilderError| TlsError::Invalid(e.to_string());
        Ok(PeerServerVerifier {
            client: WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(invalid)?,
            server: WebPkiServerVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| TlsError::Invalid(e.to_string()))?,
            domain: domain.to_string(),
        })
    }
}

impl ClientCertVerifier for PeerServerVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.client.root_hint_subjects()
    }

    fn verify_client_cert(
        &self, end_entity: &CertificateDer<'_>, intermediates: &[CertificateDer<'_>], now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        self.client
            .verify_client_cert(end_entity, intermediates, now)?;
        verify_server_names(&self.server, end_entity, intermediates, &self.domain, now)?;
        Ok(ClientCertVerified::assertion())
    }

    handshake_signatures!();

    fn client_auth_mandatory(&self) -> bool {
        true
    }
}

// ---- `cairn tls`: a CA and certificates, as `consul tls` makes them ----

/// The CA's file names in `dir`: `<domain>-agent-ca.pem` and its key.
pub fn ca_files(dir: &Path, domain: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{domain}-agent-ca.pem")),
        dir.join(format!("{domain}-agent-ca-key.pem")),
    )
}

fn validity(params: &mut rcgen::CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // A minute back: a peer whose clock is a little behind still accepts it.
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// A random positive 128-bit serial number.
fn random_serial() -> u128 {
    u128::from_be_bytes(*uuid::Uuid::new_v4().as_bytes()) >> 1
}

fn write_new(path: &Path, contents: &str, private: bool) -> Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let write = |e| TlsError::Write {
        path: display(path),
        source: e,
    };
    let mut f = opts.open(path).map_err(write)?;
    f.write_all(contents.as_bytes()).map_err(write)?;
    f.sync_all().map_err(write)
}

/// `cairn tls ca create`: a self-signed CA valid for `days`, written to
/// `dir` as `<domain>-agent-ca.pem` and `<domain>-agent-ca-key.pem`
/// (refused if either exists). Returns the two paths.
pub fn create_ca(dir: &Path, domain: &str, days: u32) -> Result<(PathBuf, PathBuf)> {
    let (cert_path, key_path) = ca_files(dir, domain);
    for p in [&cert_path, &key_path] {
        if p.exists() {
            return Err(TlsError::Exists(display(p)));
        }
    }
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::default();
    let serial = random_serial();
    params.distinguished_name = rcgen::DistinguishedName::new();
    // Consul names its CA by its serial number, so that CAs differ.
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("Consul Agent CA {serial}"),
    );
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial.to_be_bytes()));
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    validity(&mut params, days);
    let cert = params.self_signed(&key)?;
    write_new(&cert_path, &cert.pem(), false)?;
    write_new(&key_path, &key.serialize_pem(), true)?;
    Ok((cert_path, key_path))
}

/// What a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertKind {
    Server,
    Client,
}

impl CertKind {
    fn word(self) -> &'static str {
        match self {
            CertKind::Server => "server",
            CertKind::Client => "client",
        }
    }
}

/// What `cairn tls cert create` is asked for.
#[derive(Debug, Clone)]
pub struct CertRequest {
    pub kind: CertKind,
    pub datacenter: String,
    pub domain: String,
    pub ca_file: PathBuf,
    pub ca_key_file: PathBuf,
    pub days: u32,
    pub extra_dns: Vec<String>,
    pub extra_ips: Vec<IpAddr>,
}

/// `cairn tls cert create`: a certificate signed by the CA, written to
/// `dir` as `<dc>-<server|client>-<domain>-<n>.pem` and `-key.pem`, `n`
/// the first number not taken (as `consul tls` numbers them). SANs:
/// `<server|client>.<dc>.<domain>`, `localhost`, `127.0.0.1` and the extra
/// ones. Returns the two paths.
pub fn create_cert(dir: &Path, req: &CertRequest) -> Result<(PathBuf, PathBuf)> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|e| TlsError::Read {
            path: display(p),
            reason: e.to_string(),
        })
    };
    let ca_pem = read(&req.ca_file)?;
    let ca_key = rcgen::KeyPair::from_pem(&read(&req.ca_key_file)?)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;

    let name = format!("{}.{}.{}", req.kind.word(), req.datacenter, req.domain);
    let mut sans = vec![
        rcgen::SanType::DnsName(name.clone().try_into()?),
        rcgen::SanType::DnsName("localhost".to_string().try_into()?),
    ];
    for d in &req.extra_dns {
        sans.push(rcgen::SanType::DnsName(d.clone().try_into()?));
    }
    let mut ips = vec![IpAddr::from([127, 0, 0, 1])];
    ips.extend(req.extra_ips.iter().copied());
    sans.extend(ips.into_iter().map(rcgen::SanType::IpAddress));

    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.subject_alt_names = sans;
    params.serial_number = Some(rcgen::SerialNumber::from_slice(
        &random_serial().to_be_bytes(),
    ));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    // Both, as Consul's: servers are clients of each other, and clients'
    // certificates may serve an agent's HTTPS.
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, req.days);
    let cert = params.signed_by(&key, &issuer)?;

    let prefix = format!("{}-{}-{}", req.datacenter, req.kind.word(), req.domain);
    let (cert_path, key_path) = (0u32..)
        .map(|n| {
            (
                dir.join(format!("{prefix}-{n}.pem")),
                dir.join(format!("{prefix}-{n}-key.pem")),
            )
        })
        .find(|(c, k)| !c.exists() && !k.exists())
        .expect("some number is free");
    write_new(&cert_path, &cert.pem(), false)?;
    write_new(&key_path, &key.serialize_pem(), true)?;
    Ok((cert_path, key_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_cert(dir: &Path, ca: &(PathBuf, PathBuf), kind: CertKind) -> (PathBuf, PathBuf) {
        create_cert(
            dir,
            &CertRequest {
                kind,
                datacenter: "dc1".into(),
                domain: "consul".into(),
                ca_file: ca.0.clone(),
                ca_key_file: ca.1.clone(),
                days: 365,
                extra_dns: vec![],
                extra_ips: vec![],
            },
        )
        .unwrap()
    }

    #[test]
    fn files_are_numbered_as_consul_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let ca = create_ca(dir.path(), "consul", 1825).unwrap();
        assert!(ca.0.ends_with("consul-agent-ca.pem"));
        assert!(ca.1.ends_with("consul-agent-ca-key.pem"));
        assert!(matches!(
            create_ca(dir.path(), "consul", 1825),
            Err(TlsError::Exists(_))
        ));
        let a = server_cert(dir.path(), &ca, CertKind::Server);
        let b = server_cert(dir.path(), &ca, CertKind::Server);
        let c = server_cert(dir.path(), &ca, CertKind::Client);
        assert!(a.0.ends_with("dc1-server-consul-0.pem"));
        assert!(a.1.ends_with("dc1-server-consul-0-key.pem"));
        assert!(b.0.ends_with("dc1-server-consul-1.pem"));
        assert!(c.0.ends_with("dc1-client-consul-0.pem"));
        // Each loads as a pair trusting the CA.
        Tls::load(&ca.0, &a.0, &a.1).unwrap();
        Tls::load(&ca.0, &c.0, &c.1).unwrap();
        assert!(Tls::load(&ca.0, &a.0, &b.1).is_err(), "mismatched pair");
    }

    /// The Raft port's verifier takes a server certificate of the CA and
    /// refuses a client one (same CA, wrong name) and another CA's.
    #[test]
    fn raft_peers_need_a_server_certificate_of_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let ca = create_ca(dir.path(), "consul", 30).unwrap();
        let ca2 = create_ca(other.path(), "consul", 30).unwrap();
        let server = server_cert(dir.path(), &ca, CertKind::Server);
        let client = server_cert(dir.path(), &ca, CertKind::Client);
        let stranger = server_cert(other.path(), &ca2, CertKind::Server);
        let v = PeerServerVerifier::new(load_roots(&ca.0).unwrap(), "consul").unwrap();
        let check = |p: &Path| {
            let c = load_certs(p).unwrap();
            v.verify_client_cert(&c[0], &c[1..], UnixTime::now())
        };
        assert!(check(&server.0).is_ok());
        assert!(check(&client.0).is_err());
        assert!(check(&stranger.0).is_err());
        // Any datacenter's server gets in; what it proved is read after.
        let c = load_certs(&server.0).unwrap();
        let proved = Certified::of(&c[0], "dc2", "consul");
        assert_eq!(proved.datacenters, ["dc1"]);
        assert!(!proved.local && proved.serves("dc1") && !proved.serves("dc2"));
        assert!(Certified::of(&c[0], "dc1", "consul").local);
        // Another domain's servers are not ours.
        let other_domain = PeerServerVerifier::new(load_roots(&ca.0).unwrap(), "example").unwrap();
        assert!(
            other_domain
                .verify_client_cert(&c[0], &[], UnixTime::now())
                .is_err()
        );
        assert!(server_datacenters(&c[0], "example").is_empty());
        // A client dials a server of any datacenter the same way.
        let any = AnyServerVerifier {
            inner: WebPkiServerVerifier::builder_with_provider(
                load_roots(&ca.0).unwrap(),
                provider(),
            )
            .build()
            .unwrap(),
            domain: "consul".into(),
        };
        let name = ServerName::try_from("server.dc9.consul").unwrap();
        let dial = |p: &Path| {
            let c = load_certs(p).unwrap();
            any.verify_server_cert(&c[0], &c[1..], &name, &[], UnixTime::now())
        };
        assert!(dial(&server.0).is_ok());
        assert!(dial(&client.0).is_err());
        assert!(dial(&stranger.0).is_err());
    }
}
