//! Normalize and validate the mesh-wide and gateway kinds (`mesh`,
//! `ingress-gateway`, `terminating-gateway`, `exported-services`) with the
//! rules and words of Consul's `Normalize()`/`Validate()` for each. The
//! checks that need other entries (an ingress listener's protocol against
//! its services') are `crate::discovery_chain::validate_write`'s.

use super::ConfigEntryError;
use crate::structs::config_entry::*;
use std::collections::BTreeSet;

type Result<T = ()> = std::result::Result<T, ConfigEntryError>;

fn invalid(msg: impl Into<String>) -> ConfigEntryError {
    ConfigEntryError::Invalid(msg.into())
}

/// Protocols an ingress listener may have.
const LISTENER_PROTOCOLS: [&str; 4] = ["tcp", "http", "http2", "grpc"];

pub fn normalize_mesh(e: &mut MeshConfigEntry) -> Result {
    // As proxy-defaults: a delete names the one entry by kind alone.
    if e.name.is_empty() {
        e.name = MESH_CONFIG_NAME.into();
    }
    Ok(())
}

pub fn normalize_ingress(e: &mut IngressGatewayConfigEntry) {
    for l in &mut e.listeners {
        l.protocol = l.protocol.to_lowercase();
        if l.protocol.is_empty() {
            l.protocol = "tcp".into();
        }
    }
}

pub fn validate_mesh(e: &MeshConfigEntry) -> Result {
    if e.name != MESH_CONFIG_NAME {
        return Err(invalid(format!(
            "invalid name ({:?}), only {MESH_CONFIG_NAME:?} is supported",
            e.name
        )));
    }
    if let Some(tls) = &e.tls {
        if let Some(i) = &tls.incoming {
            validate_tls_params(&i.tls_min_version, &i.tls_max_version, &i.cipher_suites)
                .map_err(|m| invalid(format!("error in incoming TLS configuration: {m}")))?;
        }
        if let Some(o) = &tls.outgoing {
            validate_tls_params(&o.tls_min_version, &o.tls_max_version, &o.cipher_suites)
                .map_err(|m| invalid(format!("error in outgoing TLS configuration: {m}")))?;
        }
    }
    Ok(())
}

/// Consul's TLS versions, oldest first ("TLS_AUTO" and "" leave it to Envoy).
const TLS_VERSIONS: [&str; 4] = ["TLSv1_0", "TLSv1_1", "TLSv1_2", "TLSv1_3"];

/// The cipher suites Consul lets a proxy be configured with (Envoy's,
/// by their IANA names; the ChaCha suites by Go's old and new names).
const CIPHER_SUITES: [&str; 14] = [
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
];

fn tls_rank(v: &str) -> std::result::Result<Option<usize>, String> {
    match v {
        "" | "TLS_AUTO" => Ok(None),
        _ => TLS_VERSIONS
            .iter()
            .position(|x| *x == v)
            .map(Some)
            .ok_or_else(|| format!("no matching TLS version found for {v}")),
    }
}

fn validate_tls_params(min: &str, max: &str, suites: &[String]) -> std::result::Result<(), String> {
    let lo = tls_rank(min)?;
    let hi = tls_rank(max)?;
    if let (Some(lo), Some(hi)) = (lo, hi)
        && lo > hi
    {
        return Err(format!(
            "configuring max version {max} less than the configured min version {min} is invalid"
        ));
    }
    if !suites.is_empty() {
        // TLS 1.3's suites are not configurable (Go's and Envoy's rule).
        if min == "TLSv1_3" {
            return Err(format!(
                "configuring CipherSuites is only applicable to connections negotiated with TLS 1.2 or earlier, TLSMinVersion is set to {min}"
            ));
        }
        for s in suites {
            if !CIPHER_SUITES.contains(&s.as_str()) {
                return Err(format!("unsupported cipher suite: {s}"));
            }
        }
    }
    Ok(())
}

fn validate_gateway_tls(tls: &GatewayTlsConfig) -> std::result::Result<(), String> {
    validate_tls_params(
        &tls.tls_min_version,
        &tls.tls_max_version,
        &tls.cipher_suites,
    )
}

/// A host a listener's service answers for (Consul's `validateHost`).
fn validate_host(tls_enabled: bool, host: &str) -> Result {
    if host == WILDCARD {
        if tls_enabled {
            return Err(invalid(
                "Host '*' is not allowed when TLS is enabled, all hosts must be valid DNS records to add as a DNSSAN",
            ));
        }
        return Ok(());
    }
    let labels_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .trim_end_matches('.')
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && !l.contains(char::is_whitespace));
    if !labels_ok {
        return Err(invalid(format!(
            "Host {host:?} must be a valid DNS hostname"
        )));
    }
    if host.strip_prefix("*.").unwrap_or(host).contains('*') {
        return Err(invalid(format!(
            "Host {host:?} is not valid, a wildcard specifier is only allowed as the leftmost label"
        )));
    }
    Ok(())
}

pub fn validate_ingress(e: &IngressGatewayConfigEntry) -> Result {
    validate_gateway_tls(&e.tls).map_err(invalid)?;
    let mut ports = BTreeSet::new();
    for l in &e.listeners {
        let port = l.port;
        if !(1..=65535).contains(&port) {
            return Err(invalid(format!(
                "listener port {port} is invalid: it must be between 1 and 65535"
            )));
        }
        if !ports.insert(port) {
            return Err(invalid(format!("port {port} declared on two listeners")));
        }
        if !LISTENER_PROTOCOLS.contains(&l.protocol.as_str()) {
            return Err(invalid(format!(
                "protocol must be 'tcp', 'http', 'http2', or 'grpc'. '{}' is an unsupported protocol",
                l.protocol
            )));
        }
        if let Some(tls) = &l.tls {
            validate_gateway_tls(tls).map_err(invalid)?;
        }
        if l.services.is_empty() {
            return Err(invalid(format!(
                "No service declared for listener with port {port}"
            )));
        }
        let http = is_http_like(&l.protocol);
        if !http && l.services.len() > 1 {
            return Err(invalid(format!(
                "Multiple services per listener are only supported for L7 protocols, 'http', 'grpc' and 'http2' (listener on port {port})"
            )));
        }
        let tls_enabled = e.tls.enabled || l.tls.as_ref().is_some_and(|t| t.enabled);
        let mut names = BTreeSet::new();
        let mut hosts = BTreeSet::new();
        for s in &l.services {
            if s.name.is_empty() {
                return Err(invalid(format!(
                    "Service name cannot be blank (listener on port {port})"
                )));
            }
            for (what, m) in [
                ("request", &s.request_headers),
                ("response", &s.response_headers),
            ] {
                if !http && !HttpHeaderModifiers::is_zero(m) {
                    return Err(invalid(format!(
                        "{what} headers only valid for http, http2 and grpc protocols (service {:?} on listener on port {port})",
                        s.name
                    )));
                }
            }
            if s.name == WILDCARD && !http {
                return Err(invalid(format!(
                    "Wildcard service name is only valid for L7 protocols, 'http', 'grpc' and 'http2' (listener on port {port})"
                )));
            }
            if !s.hosts.is_empty() && !http {
                return Err(invalid(format!(
                    "Associating hosts to a service is not supported for the {} protocol (listener on port {port})",
                    l.protocol
                )));
            }
            if s.name == WILDCARD && !s.hosts.is_empty() {
                return Err(invalid(format!(
                    "Associating hosts to a wildcard service is not supported (listener on port {port})"
                )));
            }
            if s.namespace == WILDCARD {
                return Err(invalid(format!(
                    "Wildcard namespace is not supported for ingress services (listener on port {port})"
                )));
            }
            if !names.insert(s.name.as_str()) {
                return Err(invalid(format!(
                    "Service {} cannot be added multiple times (listener on port {port})",
                    s.name
                )));
            }
            for h in &s.hosts {
                if !hosts.insert(h.as_str()) {
                    return Err(invalid(format!(
                        "Hosts must be unique within a specific listener (listener on port {port})"
                    )));
                }
                validate_host(tls_enabled, h)?;
            }
            validate_service_sds(e, l, s)?;
        }
    }
    Ok(())
}

/// The SDS settings of one service on one listener, with what it
/// inherits from the listener and the gateway (Consul's
/// `validateServiceSDS`): a certificate needs a cluster at its level or
/// above, a cluster alone at the gateway needs the listener's
/// certificate, a listener's cluster its own certificate, and a service's
/// certificate at least one host to match by SNI.
fn validate_service_sds(
    e: &IngressGatewayConfigEntry, l: &IngressListener, s: &IngressService,
) -> Result {
    let port = l.port;
    let set = |sds: Option<&GatewayTlsSdsConfig>| {
        sds.map_or((false, false), |s| {
            (!s.cluster_name.is_empty(), !s.cert_resource.is_empty())
        })
    };
    let (gw_cluster, gw_cert) = set(e.tls.sds.as_ref());
    if !gw_cluster && gw_cert {
        return Err(invalid(
            "TLS.SDS.ClusterName is required if CertResource is set",
        ));
    }
    let (lis_cluster, lis_cert) = set(l.tls.as_ref().and_then(|t| t.sds.as_ref()));
    if gw_cluster && !gw_cert && !lis_cert {
        return Err(invalid(format!(
            "TLS.SDS.CertResource is required if ClusterName is set for gateway (listener on port {port})"
        )));
    }
    if lis_cluster && !lis_cert {
        return Err(invalid(format!(
            "TLS.SDS.CertResource is required if ClusterName is set for listener (listener on port {port})"
        )));
    }
    if lis_cert && !lis_cluster && !gw_cluster {
        return Err(invalid(format!(
            "TLS.SDS.ClusterName is required if CertResource is set (listener on port {port})"
        )));
    }
    let (svc_cluster, svc_cert) = set(s.tls.as_ref().and_then(|t| t.sds.as_ref()));
    if svc_cert && s.hosts.is_empty() {
        return Err(invalid(format!(
            "A service specifying TLS.SDS.CertResource must have at least one item in Hosts (service {:?} on listener on port {port})",
            s.name
        )));
    }
    if svc_cert && !svc_cluster && !lis_cluster && !gw_cluster {
        return Err(invalid(format!(
            "TLS.SDS.ClusterName is required if CertResource is set (service {:?} on listener on port {port})",
            s.name
        )));
    }
    Ok(())
}

pub fn validate_terminating(e: &TerminatingGatewayConfigEntry) -> Result {
    let mut seen = BTreeSet::new();
    for s in &e.services {
        if s.name.is_empty() {
            return Err(invalid("Service name cannot be blank."));
        }
        if s.namespace == WILDCARD {
            return Err(invalid(
                "Wildcard namespace is not supported for terminating gateway services",
            ));
        }
        if !seen.insert(s.name.as_str()) {
            return Err(invalid(format!(
                "Service {:?} was specified more than once within a namespace",
                s.name
            )));
        }
        // A client certificate needs its key and the CA to check the
        // server's with; a CA alone is one-way TLS.
        if (!s.cert_file.is_empty() || !s.key_file.is_empty())
            && (s.ca_file.is_empty() || s.cert_file.is_empty() || s.key_file.is_empty())
        {
            return Err(invalid(format!(
                "Service {:?} must have a CertFile, CAFile, and KeyFile specified for TLS origination",
                s.name
            )));
        }
    }
    Ok(())
}

pub fn validate_exported_services(e: &ExportedServicesConfigEntry) -> Result {
    if e.name == WILDCARD {
        return Err(invalid(
            "exported-services Name must be the name of a partition, and not a wildcard",
        ));
    }
    if e.name != EXPORTED_SERVICES_NAME {
        return Err(invalid(format!(
            "exported-services Name must be {EXPORTED_SERVICES_NAME:?}"
        )));
    }
    for (i, s) in e.services.iter().enumerate() {
        let err = |m: &str| invalid(format!("Services[{i}]: {m}"));
        if s.name.is_empty() {
            return Err(err("Name is required"));
        }
        if !s.namespace.is_empty() && s.namespace != "default" && s.namespace != WILDCARD {
            return Err(err(&format!(
                "Namespace {:?} is not supported: only the \"default\" namespace is served",
                s.namespace
            )));
        }
        if s.consumers.is_empty() {
            return Err(err(&format!(
                "service {:?} must have at least one consumer",
                s.name
            )));
        }
        for (j, c) in s.consumers.iter().enumerate() {
            let set = [&c.peer, &c.partition, &c.sameness_group]
                .iter()
                .filter(|v| !v.is_empty())
                .count();
            let why = if set > 1 {
                Some(
                    "Service consumer must define at most one of Peer, Partition, or SamenessGroup",
                )
            } else if set == 0 {
                Some(
                    "Service consumer must define at least one of Peer, Partition, or SamenessGroup",
                )
            } else if c.partition == WILDCARD {
                Some("Exporting to all partitions (wildcard) is not supported")
            } else if c.peer == WILDCARD {
                Some("Exporting to all peers (wildcard) is not supported")
            } else if c.sameness_group == WILDCARD {
                Some("Exporting to all sameness groups (wildcard) is not supported")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(err(&format!("Consumers[{j}]: {why}")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config_check::decode_and_validate;
    use serde_json::json;

    fn refused(v: serde_json::Value) -> String {
        decode_and_validate(&v).unwrap_err().to_string()
    }

    #[test]
    fn ingress_rules_in_consuls_words() {
        let ig = |listeners: serde_json::Value| json!({"Kind": "ingress-gateway", "Name": "ig", "Listeners": listeners});
        assert_eq!(
            refused(ig(json!([{"Port": 8080, "Protocol": "tcp",
                "Services": [{"Name": "a"}, {"Name": "b"}]}]))),
            "Multiple services per listener are only supported for L7 protocols, 'http', 'grpc' and 'http2' (listener on port 8080)"
        );
        assert_eq!(
            refused(ig(json!([{"Port": 8080, "Services": [{"Name": "*"}]}]))),
            "Wildcard service name is only valid for L7 protocols, 'http', 'grpc' and 'http2' (listener on port 8080)"
        );
        assert_eq!(
            refused(ig(json!([{"Port": 8080, "Protocol": "http",
                "Services": [{"Name": "*", "Hosts": ["a.example"]}]}]))),
            "Associating hosts to a wildcard service is not supported (listener on port 8080)"
        );
        assert_eq!(
            refused(ig(
                json!([{"Port": 8080, "Services": [{"Name": "a", "Hosts": ["x"]}]}])
            )),
            "Associating hosts to a service is not supported for the tcp protocol (listener on port 8080)"
        );
        assert_eq!(
            refused(ig(json!([{"Port": 1, "Services": [{"Name": "a"}]},
                {"Port": 1, "Services": [{"Name": "b"}]}]))),
            "port 1 declared on two listeners"
        );
        assert_eq!(
            refused(ig(
                json!([{"Port": 1, "Protocol": "udp", "Services": [{"Name": "a"}]}])
            )),
            "protocol must be 'tcp', 'http', 'http2', or 'grpc'. 'udp' is an unsupported protocol"
        );
        assert_eq!(
            refused(ig(json!([{"Port": 1, "Services": []}]))),
            "No service declared for listener with port 1"
        );
        let ok = decode_and_validate(&ig(json!([{"Port": 1, "Protocol": "HTTP",
            "Services": [{"Name": "*"}, {"Name": "a", "Hosts": ["*.a.example"]}]}])))
        .unwrap();
        assert_eq!(ok.to_json()["Listeners"][0]["Protocol"], "http");
    }

    /// SDS at the gateway, listener and service levels, with Consul's
    /// words for each missing half; a tcp listener's SDS certificate is
    /// fine, a service's own needs hosts (which tcp refuses).
    #[test]
    fn ingress_sds_needs_both_halves_at_some_level() {
        let ig = |tls: serde_json::Value, listener: serde_json::Value| json!({"Kind": "ingress-gateway", "Name": "ig", "TLS": tls, "Listeners": [listener]});
        let http = |ltls: serde_json::Value, svc: serde_json::Value| json!({"Port": 8443, "Protocol": "http", "TLS": ltls, "Services": [svc]});
        let web = json!({"Name": "web", "Hosts": ["web.example.com"]});
        assert_eq!(
            refused(ig(
                json!({"SDS": {"CertResource": "c"}}),
                http(json!(null), web.clone())
            )),
            "TLS.SDS.ClusterName is required if CertResource is set"
        );
        assert_eq!(
            refused(ig(
                json!({"SDS": {"ClusterName": "sds"}}),
                http(json!(null), web.clone())
            )),
            "TLS.SDS.CertResource is required if ClusterName is set for gateway (listener on port 8443)"
        );
        assert_eq!(
            refused(ig(
                json!({}),
                http(json!({"SDS": {"ClusterName": "sds"}}), web.clone())
            )),
            "TLS.SDS.CertResource is required if ClusterName is set for listener (listener on port 8443)"
        );
        assert_eq!(
            refused(ig(
                json!({}),
                http(json!({"SDS": {"CertResource": "c"}}), web.clone())
            )),
            "TLS.SDS.ClusterName is required if CertResource is set (listener on port 8443)"
        );
        assert_eq!(
            refused(ig(
                json!({}),
                http(
                    json!(null),
                    json!({"Name": "web", "Hosts": ["web.example.com"], "TLS": {"SDS": {"CertResource": "w"}}})
                )
            )),
            "TLS.SDS.ClusterName is required if CertResource is set (service \"web\" on listener on port 8443)"
        );
        assert_eq!(
            refused(ig(
                json!({"SDS": {"ClusterName": "sds", "CertResource": "c"}}),
                http(
                    json!(null),
                    json!({"Name": "web", "TLS": {"SDS": {"CertResource": "w"}}})
                )
            )),
            "A service specifying TLS.SDS.CertResource must have at least one item in Hosts (service \"web\" on listener on port 8443)"
        );
        // The gateway's cluster with the listener's certificate; a
        // service's certificate from the gateway's cluster.
        decode_and_validate(&ig(json!({"SDS": {"ClusterName": "sds"}}), http(
            json!({"SDS": {"CertResource": "c"}}),
            json!({"Name": "web", "Hosts": ["web.example.com"], "TLS": {"SDS": {"CertResource": "w"}}}))))
        .unwrap();
        // A tcp listener may serve an SDS certificate; a service's own
        // needs hosts, which tcp refuses.
        let tcp = |svc: serde_json::Value| {
            json!({"Port": 9443, "Protocol": "tcp",
            "TLS": {"SDS": {"ClusterName": "sds", "CertResource": "db"}}, "Services": [svc]})
        };
        decode_and_validate(&ig(json!({}), tcp(json!({"Name": "db"})))).unwrap();
        assert_eq!(
            refused(ig(
                json!({}),
                tcp(json!({"Name": "db", "TLS": {"SDS": {"CertResource": "x"}}}))
            )),
            "A service specifying TLS.SDS.CertResource must have at least one item in Hosts (service \"db\" on listener on port 9443)"
        );
    }

    /// Hostile TLS settings cost one pass and are refused whole in
    /// Consul's words: a bad suite at the end of a long list is named, at
    /// the gateway, on a listener and in the mesh entry; an SDS cluster
    /// of 1 MB without its certificate is refused without being echoed.
    #[test]
    fn huge_tls_settings_are_refused_in_consuls_words() {
        let mut suites = vec!["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"; 50_000];
        suites.push("TLS_NULL_WITH_NULL_NULL");
        let bad = "unsupported cipher suite: TLS_NULL_WITH_NULL_NULL";
        let listener = |tls: serde_json::Value| {
            json!([{"Port": 8443, "Protocol": "http", "TLS": tls,
                "Services": [{"Name": "web", "Hosts": ["web.example.com"]}]}])
        };
        let ig = |tls: serde_json::Value, listeners: serde_json::Value| json!({"Kind": "ingress-gateway", "Name": "ig", "TLS": tls, "Listeners": listeners});
        let at_gateway = refused(ig(json!({"CipherSuites": suites}), listener(json!(null))));
        assert!(at_gateway.ends_with(bad), "{at_gateway}");
        let on_listener = refused(ig(json!({}), listener(json!({"CipherSuites": suites}))));
        assert!(on_listener.ends_with(bad), "{on_listener}");
        assert_eq!(
            refused(json!({"Kind": "mesh", "Name": "mesh",
                "TLS": {"Outgoing": {"CipherSuites": suites}}})),
            format!("error in outgoing TLS configuration: {bad}")
        );
        let huge = "c".repeat(1 << 20);
        assert_eq!(
            refused(ig(
                json!({}),
                listener(json!({"SDS": {"ClusterName": huge}}))
            )),
            "TLS.SDS.CertResource is required if ClusterName is set for listener (listener on port 8443)"
        );
    }

    #[test]
    fn terminating_needs_cert_and_key_and_ca_together() {
        let tg = |svc: serde_json::Value| json!({"Kind": "terminating-gateway", "Name": "tg", "Services": [svc]});
        assert_eq!(
            refused(tg(json!({"Name": "db", "CertFile": "/c"}))),
            "Service \"db\" must have a CertFile, CAFile, and KeyFile specified for TLS origination"
        );
        decode_and_validate(&tg(json!({"Name": "db", "CAFile": "/ca"}))).unwrap();
        decode_and_validate(&tg(json!({"Name": "db", "CAFile": "/ca", "CertFile": "/c",
            "KeyFile": "/k", "SNI": "db.example"})))
        .unwrap();
    }

    #[test]
    fn mesh_and_exported_services() {
        assert_eq!(
            refused(json!({"Kind": "mesh", "Name": "other"})),
            "invalid name (\"other\"), only \"mesh\" is supported"
        );
        assert_eq!(
            refused(json!({"Kind": "mesh", "Name": "mesh",
                "TLS": {"Incoming": {"TLSMinVersion": "TLSv9"}}})),
            "error in incoming TLS configuration: no matching TLS version found for TLSv9"
        );
        let mesh_tls = |dir: &str, v: serde_json::Value| {
            refused(json!({"Kind": "mesh", "Name": "mesh", "TLS": {dir: v}}))
        };
        assert_eq!(
            mesh_tls(
                "Outgoing",
                json!({"TLSMinVersion": "TLSv1_2", "TLSMaxVersion": "TLSv1_1"})
            ),
            "error in outgoing TLS configuration: configuring max version TLSv1_1 less than the configured min version TLSv1_2 is invalid"
        );
        assert_eq!(
            mesh_tls(
                "Incoming",
                json!({"TLSMinVersion": "TLSv1_3",
                "CipherSuites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]})
            ),
            "error in incoming TLS configuration: configuring CipherSuites is only applicable to connections negotiated with TLS 1.2 or earlier, TLSMinVersion is set to TLSv1_3"
        );
        assert_eq!(
            mesh_tls(
                "Incoming",
                json!({"CipherSuites": ["TLS_RSA_WITH_RC4_128_SHA"]})
            ),
            "error in incoming TLS configuration: unsupported cipher suite: TLS_RSA_WITH_RC4_128_SHA"
        );
        decode_and_validate(&json!({"Kind": "mesh", "Name": "mesh", "TLS": {
            "Incoming": {"TLSMinVersion": "TLSv1_2", "TLSMaxVersion": "TLSv1_3",
                         "CipherSuites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]},
            "Outgoing": {"TLSMaxVersion": "TLS_AUTO"}}}))
        .unwrap();
        assert_eq!(
            refused(json!({"Kind": "exported-services", "Name": "default",
                "Services": [{"Name": "web", "Consumers": [{"Peer": "a", "Partition": "b"}]}]})),
            "Services[0]: Consumers[0]: Service consumer must define at most one of Peer, Partition, or SamenessGroup"
        );
    }
}
