//! Intentions as Envoy RBAC on the public listener, as Consul builds them:
//! with a default of allow, one DENY policy per deny intention; with a
//! default of deny, one ALLOW policy per allow intention. A source is a
//! SPIFFE URI pattern matched against the client certificate's URI SAN,
//! and a wildcard source excludes the more specific sources that a
//! higher-precedence intention names. An intention with L7 `Permissions`
//! (http destinations only) gives, in the HTTP filter, one policy per
//! permission of the enforced action: its request match, minus the earlier
//! permissions of the other action (the first match decides; a request
//! matching none falls to the default).

use envoy_types::pb::envoy::config::listener::v3 as listener;
use envoy_types::pb::envoy::config::rbac::v3 as rbac;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3 as http_rbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3 as net_rbac;
use envoy_types::pb::envoy::r#type::matcher::v3 as matcher;
use envoy_types::util::pack_any;

use crate::proxycfg::Snapshot;

/// One intention: its source service (or `*`) and its decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub source: String,
    /// L4: allow or deny every request of the source.
    pub allow: bool,
    /// L7: the source's requests, each with its decision; empty for L4.
    pub permissions: Vec<(bool, rbac::Permission)>,
}

/// The intentions whose destination is this proxy's service, highest
/// precedence first, and the default decision.
pub fn rules(snap: &Snapshot) -> (Vec<Rule>, bool) {
    let rules = snap
        .intentions
        .iter()
        .filter_map(|i| {
            if !i.permissions.is_empty() {
                return Some(Rule {
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
            Some(Rule {
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

/// The RBAC rules for `rules` over the default.
pub fn build(rules: &[Rule], default_allow: bool, trust_domain: &str) -> rbac::Rbac {
    let mut policies = std::collections::HashMap::new();
    // The action the filter enforces is the opposite of the default: only
    // intentions that say otherwise become policies.
    let enforce_allow = !default_allow;
    let mut n = 0;
    let mut l4 = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        if !r.permissions.is_empty() {
            // The first matching permission decides: a permission of the
            // enforced action applies unless an earlier one of the other
            // action matched.
            for (j, (allow, perm)) in r.permissions.iter().enumerate() {
                if *allow != enforce_allow {
                    continue;
                }
                let earlier: Vec<rbac::Permission> = r.permissions[..j]
                    .iter()
                    .filter(|(a, _)| *a != enforce_allow)
                    .map(|(_, p)| p.clone())
                    .collect();
                let permission = if earlier.is_empty() {
                    perm.clone()
                } else {
                    rbac::Permission {
                        rule: Some(rbac::permission::Rule::AndRules(rbac::permission::Set {
                            rules: vec![
                                perm.clone(),
                                rbac::Permission {
                                    rule: Some(rbac::permission::Rule::NotRule(Box::new(
                                        rbac::Permission {
                                            rule: Some(rbac::permission::Rule::OrRules(
                                                rbac::permission::Set { rules: earlier },
                                            )),
                                        },
                                    ))),
                                },
                            ],
                        })),
                    }
                };
                policies.insert(
                    format!("consul-intentions-layer7-{n}"),
                    rbac::Policy {
                        permissions: vec![permission],
                        principals: vec![source(trust_domain, &r.source)],
                        ..Default::default()
                    },
                );
                n += 1;
            }
            continue;
        }
        if r.allow != enforce_allow {
            continue;
        }
        let mut principal = source(trust_domain, &r.source);
        if r.source == "*" {
            // More specific sources of higher precedence decide for
            // themselves: every one is excluded, as Consul's (those of the
            // same action are also listed on their own, so the result is
            // the same; the shape is Consul's, the lowest precedence first).
            let exclude: Vec<rbac::Principal> = rules[..i]
                .iter()
                .rev()
                .filter(|h| h.source != "*")
                .map(|h| rbac::Principal {
                    identifier: Some(rbac::principal::Identifier::NotId(Box::new(source(
                        trust_domain,
                        &h.source,
                    )))),
                })
                .collect();
            if !exclude.is_empty() {
                let mut ids = vec![principal];
                ids.extend(exclude);
                principal = rbac::Principal {
                    identifier: Some(rbac::principal::Identifier::AndIds(rbac::principal::Set {
                        ids,
                    })),
                };
            }
        }
        l4.push(principal);
    }
    // Every L4 source in one policy, as Consul: the policies are a protobuf
    // map, whose encoding order is not fixed, so one policy keeps a
    // listener's version stable across rebuilds.
    if !l4.is_empty() {
        policies.insert(
            "consul-intentions-layer4".to_string(),
            rbac::Policy {
                permissions: vec![rbac::Permission {
                    rule: Some(rbac::permission::Rule::Any(true)),
                }],
                principals: l4,
                ..Default::default()
            },
        );
    }
    rbac::Rbac {
        action: if enforce_allow {
            rbac::rbac::Action::Allow
        } else {
            rbac::rbac::Action::Deny
        } as i32,
        policies,
        ..Default::default()
    }
}

/// The client certificates of `service` (any service for `*`), of this
/// mesh's trust domain, from any of its datacenters: a certificate another
/// CA signed for another trust domain never matches, even should a second
/// root (a peer's bundle) verify it. The trust domain goes in as it is, as
/// Consul's: it is a UUID and `.consul`, so its one `.` can only stand for
/// itself where the rest matches.
fn source(trust_domain: &str, service: &str) -> rbac::Principal {
    let svc = if service == "*" {
        "[^/]+".to_string()
    } else {
        regex_escape(service)
    };
    rbac::Principal {
        identifier: Some(rbac::principal::Identifier::Authenticated(
            rbac::principal::Authenticated {
                principal_name: Some(matcher::StringMatcher {
                    match_pattern: Some(matcher::string_matcher::MatchPattern::SafeRegex(
                        matcher::RegexMatcher {
                            regex: format!(
                                "^spiffe://{trust_domain}/ns/default/dc/[^/]+/svc/{svc}$"
                            ),
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                }),
            },
        )),
    }
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The network filter (tcp listeners), ahead of the tcp proxy.
pub fn network_filter(snap: &Snapshot) -> listener::Filter {
    let (mut rules, default_allow) = rules(snap);
    // L7 permissions exist only on http destinations, which get the HTTP
    // filter; should one reach a tcp listener, its source is left to the
    // default rather than half-applied.
    rules.retain(|r| r.permissions.is_empty());
    listener::Filter {
        name: "envoy.filters.network.rbac".into(),
        config_type: Some(listener::filter::ConfigType::TypedConfig(pack_any(
            net_rbac::Rbac {
                stat_prefix: "connect_authz".into(),
                rules: Some(build(
                    &rules,
                    default_allow,
                    &super::resources::trust_domain(snap),
                )),
                ..Default::default()
            },
        ))),
    }
}

/// The HTTP filter (http listeners), ahead of the router.
pub fn http_filter(snap: &Snapshot) -> hcm::HttpFilter {
    let (rules, default_allow) = rules(snap);
    hcm::HttpFilter {
        name: "envoy.filters.http.rbac".into(),
        config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack_any(
            http_rbac::Rbac {
                rules: Some(build(
                    &rules,
                    default_allow,
                    &super::resources::trust_domain(snap),
                )),
                ..Default::default()
            },
        ))),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TD: &str = "11111111-2222-3333-4444-555555555555.consul";

    fn rule(source: &str, allow: bool) -> Rule {
        Rule {
            source: source.into(),
            allow,
            permissions: Vec::new(),
        }
    }

    fn path(prefix: &str) -> rbac::Permission {
        super::l7_permission(&crate::structs::connect::IntentionHttpPermission {
            path_prefix: prefix.into(),
            ..Default::default()
        })
    }

    #[test]
    fn l7_permissions_deny_what_matches_after_earlier_allows() {
        // allow /public, deny /: with a default of allow, one DENY policy
        // for "/ and not /public".
        let r = build(
            &[Rule {
                source: "web".into(),
                allow: false,
                permissions: vec![(true, path("/public")), (false, path("/"))],
            }],
            true,
            TD,
        );
        assert_eq!(r.action, rbac::rbac::Action::Deny as i32);
        assert_eq!(r.policies.len(), 1);
        let p = &r.policies["consul-intentions-layer7-0"];
        let Some(rbac::permission::Rule::AndRules(set)) = &p.permissions[0].rule else {
            panic!("not an and-rule: {p:?}")
        };
        assert_eq!(set.rules[0], path("/"));
        assert!(matches!(
            set.rules[1].rule,
            Some(rbac::permission::Rule::NotRule(_))
        ));
    }

    /// The SPIFFE pattern of the L4 policy's first principal.
    fn first_source(r: &rbac::Rbac) -> &str {
        let p = &r.policies["consul-intentions-layer4"];
        let Some(rbac::principal::Identifier::Authenticated(a)) = &p.principals[0].identifier
        else {
            panic!("not an authenticated principal: {p:?}")
        };
        let Some(matcher::string_matcher::MatchPattern::SafeRegex(re)) =
            &a.principal_name.as_ref().unwrap().match_pattern
        else {
            panic!("not a regex")
        };
        &re.regex
    }

    #[test]
    fn default_allow_denies_only_deny_intentions() {
        let r = build(&[rule("web", false), rule("api", true)], true, TD);
        assert_eq!(r.action, rbac::rbac::Action::Deny as i32);
        assert_eq!(r.policies.len(), 1);
        assert_eq!(
            first_source(&r),
            "^spiffe://11111111-2222-3333-4444-555555555555.consul/ns/default/dc/[^/]+/svc/web$"
        );
    }

    #[test]
    fn default_deny_allows_allow_intentions_and_wildcards_exclude_higher_denies() {
        let r = build(&[rule("web", false), rule("*", true)], false, TD);
        assert_eq!(r.action, rbac::rbac::Action::Allow as i32);
        assert_eq!(r.policies.len(), 1);
        let p = &r.policies["consul-intentions-layer4"];
        let Some(rbac::principal::Identifier::AndIds(set)) = &p.principals[0].identifier else {
            panic!("the wildcard should exclude web: {p:?}")
        };
        assert!(matches!(
            set.ids[1].identifier,
            Some(rbac::principal::Identifier::NotId(_))
        ));
    }

    /// A certificate of another trust domain (a peer's, or any second CA
    /// the proxy trusts) is not the source an intention names.
    #[test]
    fn sources_match_only_this_trust_domain() {
        let r = build(&[rule("web", true), rule("*", false)], false, TD);
        let re = regex::Regex::new(first_source(&r)).unwrap();
        assert!(re.is_match(&format!("spiffe://{TD}/ns/default/dc/dc2/svc/web")));
        assert!(!re.is_match(
            "spiffe://99999999-2222-3333-4444-555555555555.consul/ns/default/dc/dc1/svc/web"
        ));
        assert!(!re.is_match(&format!("spiffe://{TD}/ns/default/dc/dc1/svc/api")));
    }
}
