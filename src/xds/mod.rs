//! The xDS server: a proxy's proxycfg snapshot in, Envoy resources out.
//! `resources` builds listeners, clusters, routes and endpoints from a
//! snapshot (as Consul's `agent/xds` names them), `rbac` turns intentions
//! into RBAC filters, `delta` is the incremental protocol of one stream,
//! `sotw` the state-of-the-world one (and its stream's task), `grpc` the
//! resources of gRPC's proxyless client, and `server` serves Envoy's
//! Aggregated Discovery Service (both variants) over gRPC. It reads no
//! state: the proxy's snapshot comes through a `Source`.

pub mod delta;
pub mod gateway;
pub mod grpc;
pub mod rbac;
pub mod resources;
pub mod server;
pub mod sotw;
#[cfg(test)]
mod tests;

pub use resources::{Identity, Resources, generate};
pub use server::{Ads, Caller, Limits, Source, TOKEN_METADATA};

use crate::proxycfg::Snapshot;

/// The mesh identity a snapshot carries: every CA root (the active one and
/// those still trusted after a rotation), the proxy's leaf, and the trust
/// domain (from the roots, else from the chain targets' SNI
/// `<svc>.default.<dc>.internal.<trust-domain>`).
pub fn identity(snap: &Snapshot) -> Identity {
    let trust_domain = snap
        .roots
        .as_ref()
        .map(|r| r.trust_domain.clone())
        .filter(|t| !t.is_empty())
        .or_else(|| {
            snap.upstreams
                .values()
                .filter_map(|u| u.chain.as_ref())
                .flat_map(|c| c.targets.values())
                .find_map(|t| t.sni.split_once(".internal.").map(|(_, td)| td.to_string()))
        })
        .unwrap_or_default();
    let mut roots_pem = String::new();
    for root in snap.roots.iter().flat_map(|r| r.roots.iter()) {
        roots_pem.push_str(root.root_cert.trim_end());
        roots_pem.push('\n');
    }
    Identity {
        roots_pem,
        leaf: snap
            .leaf
            .as_ref()
            .map(|l| (l.cert_pem.clone(), l.private_key_pem.clone())),
        trust_domain,
    }
}

/// The intentions with this proxy's service as destination (highest
/// precedence first) as rules, and the default decision.
pub fn intention_rules(snap: &Snapshot) -> (Vec<rbac::Rule>, bool) {
    let rules = snap
        .intentions
        .iter()
        .filter_map(|i| {
            if !i.permissions.is_empty() {
                return Some(rbac::Rule {
                    source: i.source_name.clone(),
                    allow: false,
                    permissions: i
                        .permissions
                        .iter()
                        .map(|p| {
                            let http = p.http.clone().unwrap_or_default();
                            (p.action == "allow", l7_permission(&http))
                        })
                        .collect(),
                });
            }
            let allow = match i.action.as_deref()? {
                "allow" => true,
                "deny" => false,
                _ => return None,
            };
            Some(rbac::Rule {
                source: i.source_name.clone(),
                allow,
                permissions: Vec::new(),
            })
        })
        .collect();
    (rules, snap.intentions_default_allow)
}

/// An L7 permission's request match: path (exact, prefix or regex),
/// headers and methods, all of which must hold (any request when none).
pub fn l7_permission(
    http: &crate::structs::connect::IntentionHttpPermission,
) -> envoy_types::pb::envoy::config::rbac::v3::Permission {
    use envoy_types::pb::envoy::config::rbac::v3::{Permission, permission};
    use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        PathMatcher, RegexMatcher, StringMatcher, path_matcher, string_matcher,
    };
    let string = |p: string_matcher::MatchPattern| StringMatcher {
        match_pattern: Some(p),
        ..Default::default()
    };
    let regex = |r: &str| {
        string_matcher::MatchPattern::SafeRegex(RegexMatcher {
            regex: r.to_string(),
            ..Default::default()
        })
    };
    let mut rules = Vec::new();
    let path = if !http.path_exact.is_empty() {
        Some(string_matcher::MatchPattern::Exact(http.path_exact.clone()))
    } else if !http.path_prefix.is_empty() {
        Some(string_matcher::MatchPattern::Prefix(
            http.path_prefix.clone(),
        ))
    } else if !http.path_regex.is_empty() {
        Some(regex(&http.path_regex))
    } else {
        None
    };
    if let Some(p) = path {
        rules.push(Permission {
            rule: Some(permission::Rule::UrlPath(PathMatcher {
                rule: Some(path_matcher::Rule::Path(string(p))),
            })),
        });
    }
    for h in &http.header {
        let spec = if h.present {
            header_matcher::HeaderMatchSpecifier::PresentMatch(true)
        } else if !h.exact.is_empty() {
            header_matcher::HeaderMatchSpecifier::StringMatch(string(
                string_matcher::MatchPattern::Exact(h.exact.clone()),
            ))
        } else if !h.prefix.is_empty() {
            header_matcher::HeaderMatchSpecifier::StringMatch(string(
                string_matcher::MatchPattern::Prefix(h.prefix.clone()),
            ))
        } else if !h.suffix.is_empty() {
            header_matcher::HeaderMatchSpecifier::StringMatch(string(
                string_matcher::MatchPattern::Suffix(h.suffix.clone()),
            ))
        } else {
            header_matcher::HeaderMatchSpecifier::StringMatch(string(regex(&h.regex)))
        };
        rules.push(Permission {
            rule: Some(permission::Rule::Header(HeaderMatcher {
                name: h.name.clone(),
                invert_match: h.invert,
                header_match_specifier: Some(spec),
                ..Default::default()
            })),
        });
    }
    if !http.methods.is_empty() {
        rules.push(Permission {
            rule: Some(permission::Rule::Header(HeaderMatcher {
                name: ":method".into(),
                header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
                    string(regex(&http.methods.join("|"))),
                )),
                ..Default::default()
            })),
        });
    }
    match rules.len() {
        0 => Permission {
            rule: Some(permission::Rule::Any(true)),
        },
        1 => rules.pop().expect("one"),
        _ => Permission {
            rule: Some(permission::Rule::AndRules(permission::Set { rules })),
        },
    }
}
