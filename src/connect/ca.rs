//! The built-in (`consul`) CA provider: its configuration with Consul's
//! defaults and validation, root generation, rotation with cross-signing,
//! and signing of leaf certificates from CSRs.
//!
//! Pure functions over PEM: the leader calls them to build a `CaState` it
//! then proposes through Raft; servers sign CSRs with the active root's key
//! read from their state. Keys are EC (P-256 by default, P-384): ring,
//! the only crypto provider here, cannot generate RSA keys.

use std::collections::BTreeMap;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use serde_json::Value;
use time::OffsetDateTime;

use crate::error::{Error, Result};
use crate::state::connect::{CaState, StoredRoot};
use crate::structs::connect::{CaConfiguration, CaRoot, IssuedCert};
use crate::structs::duration::Duration;

/// Consul's defaults for the built-in provider.
pub const DEFAULT_LEAF_TTL: &str = "72h";
pub const DEFAULT_ROTATION_PERIOD: &str = "2160h";
pub const DEFAULT_INTERMEDIATE_TTL: &str = "8760h";
/// A root lives ten years, as Consul's.
const ROOT_TTL_DAYS: i64 = 3650;

/// The provider settings that matter here, parsed and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    pub leaf_ttl: std::time::Duration,
    pub key_type: String,
    pub key_bits: u32,
    /// A key the operator gave (PEM); the root is made from it.
    pub private_key: String,
}

fn duration_of(config: &BTreeMap<String, Value>, key: &str, default: &str) -> Result<Duration> {
    let v = config.get(key).cloned().unwrap_or(Value::Null);
    let d: Duration = match v {
        Value::Null => Duration::parse(default).map_err(Error::bad)?,
        Value::String(s) if s.is_empty() => Duration::parse(default).map_err(Error::bad)?,
        v => serde_json::from_value(v).map_err(|e| Error::bad(format!("{key}: {e}")))?,
    };
    Ok(d)
}

/// The configuration a PUT gives, with Consul's defaults filled in and its
/// checks applied (`structs.CommonCAProviderConfig.Validate` and the
/// consul provider's).
pub fn normalize(mut cfg: CaConfiguration) -> Result<(CaConfiguration, ProviderConfig)> {
    if cfg.provider.is_empty() {
        cfg.provider = "consul".into();
    }
    if cfg.provider != "consul" {
        return Err(Error::bad(format!(
            "Provider {:?} is not supported: only the built-in \"consul\" provider is",
            cfg.provider
        )));
    }
    // Keys are matched as Consul's mapstructure decoding does: any case.
    let mut c: BTreeMap<String, Value> = BTreeMap::new();
    for (k, v) in std::mem::take(&mut cfg.config) {
        let canon = [
            "LeafCertTTL",
            "RotationPeriod",
            "IntermediateCertTTL",
            "PrivateKeyType",
            "PrivateKeyBits",
            "PrivateKey",
            "RootCert",
            "RootCertTTL",
            "CSRMaxPerSecond",
            "CSRMaxConcurrent",
        ]
        .into_iter()
        .find(|c| c.eq_ignore_ascii_case(&k.replace('_', "")))
        .map(str::to_string)
        .unwrap_or(k);
        c.insert(canon, v);
    }
    let leaf = duration_of(&c, "LeafCertTTL", DEFAULT_LEAF_TTL)?;
    let rotation = duration_of(&c, "RotationPeriod", DEFAULT_ROTATION_PERIOD)?;
    let intermediate = duration_of(&c, "IntermediateCertTTL", DEFAULT_INTERMEDIATE_TTL)?;
    let hour = Duration::from_secs(3600);
    if leaf.0 < Duration::from_secs(3600).0 {
        return Err(Error::bad(
            "leaf cert TTL must be greater or equal than 1h0m0s",
        ));
    }
    if leaf.0 > Duration::from_secs(365 * 24 * 3600).0 {
        return Err(Error::bad("leaf cert TTL must be less than 8760h0m0s"));
    }
    if intermediate.0 < hour.0 * 3 {
        return Err(Error::bad(
            "Intermediate Cert TTL must be greater or equal than 3h",
        ));
    }
    if intermediate.0 < leaf.0 * 3 {
        return Err(Error::bad(format!(
            "Intermediate Cert TTL must be greater than 3 times the Leaf Cert TTL ({})",
            Duration(leaf.0 * 3)
        )));
    }
    if rotation.0 <= 0 {
        return Err(Error::bad("RotationPeriod must be positive"));
    }
    let key_type = match c.get("PrivateKeyType") {
        None | Some(Value::Null) => "ec".to_string(),
        Some(Value::String(s)) if s.is_empty() => "ec".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => {
            return Err(Error::bad(format!(
                "PrivateKeyType: expected a string, got {v}"
            )));
        }
    };
    let bits = match c.get("PrivateKeyBits") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| Error::bad(format!("PrivateKeyBits: expected a number, got {v}")))?
            as u32,
    };
    let key_bits = match (key_type.as_str(), bits) {
        ("ec", 0) => 256,
        ("ec", 256 | 384) => bits,
        ("ec", 224 | 521) => {
            return Err(Error::bad(format!(
                "EC key length {bits} is not supported here (256 or 384)"
            )));
        }
        ("ec", _) => {
            return Err(Error::bad(
                "EC key length must be one of (224, 256, 384, 521) bits",
            ));
        }
        ("rsa", 0 | 2048 | 3072 | 4096) => {
            return Err(Error::bad(
                "PrivateKeyType rsa is not supported by this server: ring cannot generate RSA keys; use ec",
            ));
        }
        ("rsa", _) => return Err(Error::bad("RSA key length must be at least 2048 bits")),
        (t, _) => return Err(Error::bad(format!("unknown private key type {t:?}"))),
    };
    let private_key = match c.get("PrivateKey") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.trim().to_string(),
        Some(v) => {
            return Err(Error::bad(format!(
                "PrivateKey: expected a string, got {v}"
            )));
        }
    };
    if !private_key.is_empty() {
        let key = KeyPair::from_pem(&private_key)
            .map_err(|e| Error::bad(format!("error parsing private key: {e}")))?;
        if alg_for(&key_type, key_bits) != key.algorithm() {
            return Err(Error::bad(
                "PrivateKey does not match PrivateKeyType and PrivateKeyBits",
            ));
        }
    }
    if c.get("RootCert")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return Err(Error::bad(
            "RootCert is not supported: give PrivateKey and the root is made from it",
        ));
    }
    c.insert("LeafCertTTL".into(), Value::String(leaf.to_string()));
    c.insert("RotationPeriod".into(), Value::String(rotation.to_string()));
    c.insert(
        "IntermediateCertTTL".into(),
        Value::String(intermediate.to_string()),
    );
    c.insert("PrivateKeyType".into(), Value::String(key_type.clone()));
    c.insert("PrivateKeyBits".into(), Value::from(key_bits));
    cfg.config = c;
    let provider = ProviderConfig {
        leaf_ttl: std::time::Duration::from_nanos(leaf.0 as u64),
        key_type,
        key_bits,
        private_key,
    };
    Ok((cfg, provider))
}

/// The stored configuration's provider settings.
pub fn provider_of(ca: &CaState) -> ProviderConfig {
    normalize(ca.config.clone())
        .map(|(_, p)| p)
        .unwrap_or(ProviderConfig {
            leaf_ttl: std::time::Duration::from_secs(72 * 3600),
            key_type: "ec".into(),
            key_bits: 256,
            private_key: String::new(),
        })
}

fn alg_for(_key_type: &str, bits: u32) -> &'static rcgen::SignatureAlgorithm {
    if bits == 384 {
        &rcgen::PKCS_ECDSA_P384_SHA384
    } else {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

fn crypto(e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("connect CA: {e}"))
}

/// Colon-separated lowercase hex, as Consul shows key IDs and serials.
pub fn colon_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn random_serial() -> u64 {
    // Positive and nonzero as X.509 wants, from the system's randomness.
    (rand::random::<u64>() >> 1).max(1)
}

/// The first eight characters of the trust domain's cluster id, as
/// Consul's common names use it.
fn short_domain(trust_domain: &str) -> String {
    let id = trust_domain.split('.').next().unwrap_or_default();
    format!("{}.consul", id.chars().take(8).collect::<String>())
}

fn root_params(trust_domain: &str, serial: u64) -> Result<CertificateParams> {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!(
            "pri-{:x}.ca.{}",
            serial & 0xffff_ffff,
            short_domain(trust_domain)
        ),
    );
    p.distinguished_name = dn;
    p.serial_number = Some(SerialNumber::from_slice(&serial.to_be_bytes()));
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    p.subject_alt_names = vec![SanType::URI(
        format!("spiffe://{trust_domain}")
            .try_into()
            .map_err(crypto)?,
    )];
    let now = OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::minutes(1);
    p.not_after = now + time::Duration::days(ROOT_TTL_DAYS);
    Ok(p)
}

/// A new root for `trust_domain` (a fresh key, or the operator's).
pub fn new_root(trust_domain: &str, provider: &ProviderConfig) -> Result<StoredRoot> {
    new_root_params(trust_domain, provider).map(|(r, _)| r)
}

/// A new root and the parameters it was made from (for cross-signing).
fn new_root_params(
    trust_domain: &str,
    provider: &ProviderConfig,
) -> Result<(StoredRoot, CertificateParams)> {
    let key = if provider.private_key.is_empty() {
        KeyPair::generate_for(alg_for(&provider.key_type, provider.key_bits)).map_err(crypto)?
    } else {
        KeyPair::from_pem(&provider.private_key).map_err(|e| Error::bad(e.to_string()))?
    };
    let serial = random_serial();
    let params = root_params(trust_domain, serial)?;
    let ski = params.key_identifier(&key);
    let cert = params.self_signed(&key).map_err(crypto)?;
    let id = colon_hex(
        ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, cert.der()).as_ref(),
    );
    let root = CaRoot {
        id,
        name: "Consul CA Primary Cert".into(),
        serial_number: serial,
        signing_key_id: colon_hex(&ski),
        external_trust_domain: trust_domain.split('.').next().unwrap_or_default().into(),
        not_before: rfc3339(params.not_before),
        not_after: rfc3339(params.not_after),
        root_cert: cert.pem(),
        intermediate_certs: Vec::new(),
        active: true,
        rotated_out_at: "0001-01-01T00:00:00Z".into(),
        private_key_type: provider.key_type.clone(),
        private_key_bits: provider.key_bits,
        create_index: 0,
        modify_index: 0,
    };
    Ok((
        StoredRoot {
            root,
            signing_key: key.serialize_pem(),
        },
        params,
    ))
}

/// The first CA of a cluster: Consul's default configuration, one root.
pub fn initial(cluster_id: &str) -> Result<CaState> {
    let (config, provider) = normalize(CaConfiguration {
        cluster_id: cluster_id.to_string(),
        provider: "consul".into(),
        ..Default::default()
    })?;
    let root = new_root(&format!("{cluster_id}.consul"), &provider)?;
    Ok(CaState {
        config,
        roots: vec![root],
    })
}

/// Whether moving from `old` to `new` settings needs a new root: a new
/// key, or another key type or size (as Consul decides).
fn needs_rotation(old: &ProviderConfig, new: &ProviderConfig) -> bool {
    old.key_type != new.key_type
        || old.key_bits != new.key_bits
        || (!new.private_key.is_empty() && new.private_key != old.private_key)
}

/// The CA after a configuration PUT: the new settings, and when they ask
/// for a new key a new active root, cross-signed by the old one (the
/// cross-signed certificate in its `IntermediateCerts`), the old root kept
/// inactive so leaves it signed keep verifying until they renew.
pub fn reconfigure(
    current: &CaState,
    body: CaConfiguration,
    trust_domain: &str,
) -> Result<CaState> {
    let (mut config, provider) = normalize(body)?;
    config.cluster_id = current.config.cluster_id.clone();
    let old_provider = provider_of(current);
    let mut next = CaState {
        config,
        roots: current.roots.clone(),
    };
    if !needs_rotation(&old_provider, &provider) {
        return Ok(next);
    }
    let old = current
        .active()
        .ok_or_else(|| Error::Internal("the CA has no active root".into()))?;
    let (mut new, params) = new_root_params(trust_domain, &provider)?;
    if !next.config.force_without_cross_signing {
        new.root.intermediate_certs = vec![cross_sign(old, &new, params)?];
    }
    let now = rfc3339(OffsetDateTime::now_utc());
    for r in &mut next.roots {
        if r.root.active {
            r.root.active = false;
            r.root.rotated_out_at = now.clone();
        }
    }
    next.roots.push(new);
    Ok(next)
}

/// `new`'s root certificate re-signed by `old`'s key: same subject and
/// public key, issued by the old root, so a chain leaf → cross-signed →
/// old root verifies for peers that trust only the old root.
fn cross_sign(old: &StoredRoot, new: &StoredRoot, mut params: CertificateParams) -> Result<String> {
    let old_key = KeyPair::from_pem(&old.signing_key).map_err(crypto)?;
    let issuer = Issuer::from_ca_cert_pem(&old.root.root_cert, old_key).map_err(crypto)?;
    let new_key = KeyPair::from_pem(&new.signing_key).map_err(crypto)?;
    params.serial_number = Some(SerialNumber::from_slice(&random_serial().to_be_bytes()));
    // Valid no longer than the old root that vouches for it.
    if let Ok(t) = OffsetDateTime::parse(
        &old.root.not_after,
        &time::format_description::well_known::Rfc3339,
    ) {
        params.not_after = params.not_after.min(t);
    }
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&new_key, &issuer).map_err(crypto)?;
    Ok(cert.pem())
}

/// The SPIFFE ID of a service in a datacenter.
pub fn service_uri(trust_domain: &str, dc: &str, service: &str) -> String {
    format!("spiffe://{trust_domain}/ns/default/dc/{dc}/svc/{service}")
}

/// A new key and a CSR for `service` (made where the key stays: a server
/// for its own leaves, an agent for its services').
pub fn new_csr(trust_domain: &str, dc: &str, service: &str) -> Result<(String, String)> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(crypto)?;
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.subject_alt_names = vec![SanType::URI(
        service_uri(trust_domain, dc, service)
            .try_into()
            .map_err(|e| Error::bad(format!("invalid service name {service:?}: {e}")))?,
    )];
    let csr = p.serialize_request(&key).map_err(crypto)?;
    Ok((key.serialize_pem(), csr.pem().map_err(crypto)?))
}

/// Signs a CSR with the active root: the CSR must ask for exactly one URI
/// SAN, the SPIFFE ID of a service of this trust domain and datacenter.
/// The leaf carries Consul's common name and DNS SAN, is valid for the
/// configured TTL, and its PEM is followed by the root's intermediates (the
/// cross-signed root after a rotation), as Consul's `Sign` answers.
/// A CSR read and checked: one SPIFFE service ID of this trust domain and
/// datacenter. `service` says who asks, so the caller can authorize
/// before anything is signed.
pub struct Csr {
    params: CertificateSigningRequestParams,
    uri: String,
    pub service: String,
}

pub fn parse_csr(csr_pem: &str, trust_domain: &str, dc: &str) -> Result<Csr> {
    let csr = CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|e| Error::bad(format!("invalid CSR: {e}")))?;
    let uris: Vec<String> = csr
        .params
        .subject_alt_names
        .iter()
        .filter_map(|s| match s {
            SanType::URI(u) => Some(u.as_str().to_string()),
            _ => None,
        })
        .collect();
    let [uri] = uris.as_slice() else {
        return Err(Error::bad("CSR must have exactly one URI SAN"));
    };
    let prefix = format!("spiffe://{trust_domain}/ns/default/dc/{dc}/svc/");
    let service = uri
        .strip_prefix(&prefix)
        .filter(|s| !s.is_empty() && !s.contains('/'))
        .ok_or_else(|| {
            Error::bad(format!(
                "SPIFFE ID in CSR from a different trust domain or datacenter: {uri}"
            ))
        })?
        .to_string();
    Ok(Csr {
        uri: uri.clone(),
        params: csr,
        service,
    })
}

/// Signs a checked CSR with the active root.
pub fn sign_csr(ca: &CaState, trust_domain: &str, csr: Csr) -> Result<IssuedCert> {
    let Csr {
        params: csr,
        uri,
        service,
    } = csr;
    let active = ca
        .active()
        .ok_or_else(|| Error::Internal("the CA has no active root".into()))?;
    let key = KeyPair::from_pem(&active.signing_key).map_err(crypto)?;
    let issuer = Issuer::from_ca_cert_pem(&active.root.root_cert, key).map_err(crypto)?;
    let provider = provider_of(ca);
    let serial = random_serial();
    let cn = format!("{service}.svc.default.{}", short_domain(trust_domain));
    let mut params = csr.params.clone();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn.clone());
    params.distinguished_name = dn;
    params.subject_alt_names = vec![
        SanType::URI(uri.clone().try_into().map_err(crypto)?),
        SanType::DnsName(cn.try_into().map_err(crypto)?),
    ];
    params.serial_number = Some(SerialNumber::from_slice(&serial.to_be_bytes()));
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::KeyAgreement,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + time::Duration::try_from(provider.leaf_ttl).map_err(crypto)?;
    let csr = CertificateSigningRequestParams {
        params,
        public_key: csr.public_key,
    };
    let cert = csr.signed_by(&issuer).map_err(crypto)?;
    let mut pem = cert.pem();
    for i in &active.root.intermediate_certs {
        if !pem.ends_with('\n') {
            pem.push('\n');
        }
        pem.push_str(i);
    }
    Ok(IssuedCert {
        serial_number: colon_hex(&serial.to_be_bytes()),
        cert_pem: pem,
        private_key_pem: String::new(),
        service: service.clone(),
        service_uri: uri.clone(),
        valid_after: rfc3339(now - time::Duration::minutes(1)),
        valid_before: rfc3339(csr_not_after(now, provider.leaf_ttl)),
        namespace: "default".into(),
        partition: "default".into(),
        create_index: ca.config.modify_index,
        modify_index: ca.config.modify_index,
    })
}

fn csr_not_after(now: OffsetDateTime, ttl: std::time::Duration) -> OffsetDateTime {
    now + time::Duration::try_from(ttl).unwrap_or(time::Duration::ZERO)
}

/// A leaf for `service` signed directly (a server's own leaves): key and
/// CSR made here, the key returned with the certificate.
pub fn sign_local(ca: &CaState, trust_domain: &str, dc: &str, service: &str) -> Result<IssuedCert> {
    let (key, csr) = new_csr(trust_domain, dc, service)?;
    let mut cert = sign_csr(ca, trust_domain, parse_csr(&csr, trust_domain, dc)?)?;
    cert.private_key_pem = key;
    Ok(cert)
}

/// When a leaf should be renewed: past 60% of its lifetime (Consul renews
/// between 60% and 90%), or at once if it is unreadable.
pub fn renew_at(cert: &IssuedCert) -> OffsetDateTime {
    let parse =
        |s: &str| OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok();
    match (parse(&cert.valid_after), parse(&cert.valid_before)) {
        (Some(a), Some(b)) => a + (b - a) * 0.6,
        _ => OffsetDateTime::UNIX_EPOCH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_consuls() {
        let (c, p) = normalize(CaConfiguration::default()).unwrap();
        assert_eq!(c.provider, "consul");
        assert_eq!(c.config["LeafCertTTL"], "72h0m0s");
        assert_eq!(c.config["RotationPeriod"], "2160h0m0s");
        assert_eq!(c.config["IntermediateCertTTL"], "8760h0m0s");
        assert_eq!((p.key_type.as_str(), p.key_bits), ("ec", 256));
        // snake_case keys are accepted, as Consul's decoder does.
        let mut cfg = CaConfiguration::default();
        cfg.config.insert("leaf_cert_ttl".into(), "24h".into());
        let (c, _) = normalize(cfg).unwrap();
        assert_eq!(c.config["LeafCertTTL"], "24h0m0s");
    }

    #[test]
    fn only_this_clusters_spiffe_ids_are_signed() {
        let ca = initial("11111111-2222-3333-4444-555555555555").unwrap();
        let td = "11111111-2222-3333-4444-555555555555.consul";
        let (_, csr) = new_csr(td, "dc1", "web").unwrap();
        let cert = sign_csr(&ca, td, parse_csr(&csr, td, "dc1").unwrap()).unwrap();
        assert_eq!(cert.service, "web");
        assert_eq!(cert.service_uri, service_uri(td, "dc1", "web"));
        let (_, other) =
            new_csr("99999999-2222-3333-4444-555555555555.consul", "dc1", "web").unwrap();
        assert!(matches!(
            parse_csr(&other, td, "dc1"),
            Err(Error::BadRequest(_))
        ));
        let (_, other_dc) = new_csr(td, "dc2", "web").unwrap();
        assert!(matches!(
            parse_csr(&other_dc, td, "dc1"),
            Err(Error::BadRequest(_))
        ));
    }
}
