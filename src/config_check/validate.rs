//! Per-kind normalization and validation, following the rules (and the error
//! wording) of Consul's `Normalize()` and `Validate()` for each kind.

use super::ConfigEntryError;
use crate::structs::config_entry::*;
use regex::Regex;
use std::collections::BTreeMap;
use std::sync::LazyLock;

type Result<T = ()> = std::result::Result<T, ConfigEntryError>;

fn invalid(msg: impl Into<String>) -> ConfigEntryError {
    ConfigEntryError::Invalid(msg.into())
}

/// Fills in what Consul fills in before validating.
pub fn normalize(entry: &mut ConfigEntry) -> Result {
    let kind = entry.kind().as_str().to_string();
    match entry {
        ConfigEntry::ProxyDefaults(e) => {
            e.kind = kind;
            // Checked here as well as in validate: deletes only normalize.
            if !e.name.is_empty() && e.name != PROXY_CONFIG_GLOBAL {
                return Err(invalid(format!(
                    "invalid name ({:?}), only {PROXY_CONFIG_GLOBAL:?} is supported",
                    e.name
                )));
            }
            e.name = PROXY_CONFIG_GLOBAL.into();
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
        }
        ConfigEntry::ServiceDefaults(e) => {
            e.kind = kind;
            e.protocol = e.protocol.to_lowercase();
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
            if let Some(uc) = &mut e.upstream_config {
                for o in uc.overrides.iter_mut().chain(uc.defaults.as_mut()) {
                    o.protocol = o.protocol.to_lowercase();
                    o.connect_timeout_ms = o.connect_timeout_ms.max(0);
                }
            }
        }
        ConfigEntry::ServiceRouter(e) => {
            e.kind = kind;
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
            for route in &mut e.routes {
                if let Some(http) = route.match_.as_mut().and_then(|m| m.http.as_mut()) {
                    for m in &mut http.methods {
                        *m = m.to_uppercase();
                    }
                }
            }
        }
        ConfigEntry::ServiceSplitter(e) => {
            e.kind = kind;
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
            for split in &mut e.splits {
                split.weight = normalize_split_weight(split.weight);
            }
        }
        ConfigEntry::ServiceResolver(e) => {
            e.kind = kind;
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
        }
        ConfigEntry::ServiceIntentions(e) => {
            e.kind = kind;
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
            super::intentions::normalize(e);
        }
        ConfigEntry::Mesh(e) => {
            e.kind = kind;
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
            super::gateways::normalize_mesh(e)?;
        }
        ConfigEntry::IngressGateway(e) => {
            e.kind = kind;
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
            super::gateways::normalize_ingress(e);
        }
        ConfigEntry::TerminatingGateway(e) => {
            e.kind = kind;
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
        }
        ConfigEntry::ExportedServices(e) => {
            e.kind = kind;
            normalize_tenancy(&mut e.namespace, &mut e.partition)?;
        }
    }
    Ok(())
}

/// Only the default namespace and partition are served; "default" is
/// stored as empty, as Consul's community edition shows it.
fn normalize_tenancy(namespace: &mut String, partition: &mut String) -> Result {
    for (what, v) in [
        ("Namespace", &mut *namespace),
        ("Partition", &mut *partition),
    ] {
        if v == "default" {
            v.clear();
        }
        if !v.is_empty() {
            return Err(invalid(format!(
                "{what} {v:?} is not supported: only the \"default\" {} is served",
                what.to_lowercase()
            )));
        }
    }
    Ok(())
}

/// Consul's per-kind `Validate()`.
pub fn validate(entry: &ConfigEntry) -> Result {
    if entry.name().is_empty() {
        return Err(invalid("Name is required"));
    }
    validate_meta(entry.meta())?;
    match entry {
        ConfigEntry::ProxyDefaults(e) => validate_proxy_defaults(e),
        ConfigEntry::ServiceDefaults(e) => validate_service_defaults(e),
        ConfigEntry::ServiceRouter(e) => validate_router(e),
        ConfigEntry::ServiceSplitter(e) => validate_splitter(e),
        ConfigEntry::ServiceResolver(e) => validate_resolver(e),
        ConfigEntry::ServiceIntentions(e) => super::intentions::validate(e),
        ConfigEntry::Mesh(e) => super::gateways::validate_mesh(e),
        ConfigEntry::IngressGateway(e) => super::gateways::validate_ingress(e),
        ConfigEntry::TerminatingGateway(e) => super::gateways::validate_terminating(e),
        ConfigEntry::ExportedServices(e) => super::gateways::validate_exported_services(e),
    }
}

fn validate_meta(meta: &BTreeMap<String, String>) -> Result {
    const MAX_PAIRS: usize = 64;
    const MAX_KEY: usize = 128;
    const MAX_VALUE: usize = 512;
    if meta.len() > MAX_PAIRS {
        return Err(invalid(format!(
            "Meta exceeds maximum element count {MAX_PAIRS}"
        )));
    }
    for (k, v) in meta {
        if k.len() > MAX_KEY {
            return Err(invalid(format!(
                "Meta key {k:?} exceeds maximum length {MAX_KEY}"
            )));
        }
        if v.len() > MAX_VALUE {
            return Err(invalid(format!(
                "Meta value for key {k:?} exceeds maximum length {MAX_VALUE}"
            )));
        }
    }
    Ok(())
}

fn validate_proxy_mode(mode: &str) -> Result {
    match mode {
        "" | "direct" | "transparent" => Ok(()),
        _ => Err(invalid(format!("Invalid proxy mode: {mode:?}"))),
    }
}

/// A port, as a registration's is checked.
fn validate_outbound_port(t: &crate::structs::config_entry::TransparentProxyConfig) -> Result {
    let p = t.outbound_listener_port;
    if (0..=65535).contains(&p) {
        Ok(())
    } else {
        Err(invalid(format!(
            "Invalid TransparentProxy.OutboundListenerPort {p}: must be between 0 and 65535"
        )))
    }
}

fn validate_mesh_gateway(mg: &MeshGatewayConfig) -> Result {
    match mg.mode.as_str() {
        "" | "none" | "local" | "remote" => Ok(()),
        m => Err(invalid(format!("Invalid mesh gateway mode: {m:?}"))),
    }
}

fn validate_mutual_tls_mode(mode: &str) -> Result {
    match mode {
        "" | "strict" | "permissive" => Ok(()),
        _ => Err(invalid(format!(
            "Invalid MutualTLSMode {mode:?}. Must be one of \"\", \"strict\", or \"permissive\"."
        ))),
    }
}

fn validate_envoy_extensions(exts: &[EnvoyExtension]) -> Result {
    for (i, ext) in exts.iter().enumerate() {
        if ext.name.is_empty() {
            return Err(invalid(format!(
                "invalid EnvoyExtensions[{i}]: Name is required"
            )));
        }
    }
    Ok(())
}

fn validate_proxy_defaults(e: &ProxyConfigEntry) -> Result {
    if e.name != PROXY_CONFIG_GLOBAL {
        return Err(invalid(format!(
            "invalid name ({:?}), only {PROXY_CONFIG_GLOBAL:?} is supported",
            e.name
        )));
    }
    validate_proxy_mode(&e.mode)?;
    validate_outbound_port(&e.transparent_proxy)?;
    validate_mesh_gateway(&e.mesh_gateway)?;
    validate_mutual_tls_mode(&e.mutual_tls_mode)?;
    validate_envoy_extensions(&e.envoy_extensions)?;
    if let Some(logs) = &e.access_logs {
        match logs.log_type.as_str() {
            "" | "file" | "stdout" | "stderr" => {}
            t => return Err(invalid(format!("invalid access log type: {t:?}"))),
        }
        if logs.log_type == "file" && logs.path.is_empty() {
            return Err(invalid(
                "path must be specified when using file type access logs",
            ));
        }
        if logs.log_type != "file" && !logs.path.is_empty() {
            return Err(invalid("path is only valid for file type access logs"));
        }
        if !logs.json_format.is_empty() && !logs.text_format.is_empty() {
            return Err(invalid(
                "cannot specify both access log JSONFormat and TextFormat",
            ));
        }
    }
    if let Some(p) = &e.failover_policy {
        validate_failover_policy_mode(&p.mode)
            .map_err(|m| invalid(format!("FailoverPolicy: {m}")))?;
    }
    Ok(())
}

fn validate_failover_policy_mode(mode: &str) -> std::result::Result<(), String> {
    match mode {
        "" | "default" | "order-by-locality" => Ok(()),
        _ => Err("Policy must be one of '', 'default', or 'order-by-locality'".into()),
    }
}

fn valid_connection_balance(v: &str) -> bool {
    v.is_empty() || v == "exact_balance"
}

fn validate_service_defaults(e: &ServiceConfigEntry) -> Result {
    if e.name == "*" {
        return Err(invalid(
            "service-defaults name must be the name of a service, and not a wildcard",
        ));
    }
    let mut errs: Vec<String> = Vec::new();
    if !valid_connection_balance(&e.balance_inbound_connections) {
        errs.push(format!(
            "invalid value for balance_inbound_connections: {}",
            e.balance_inbound_connections
        ));
    }
    if e.upstream_config.is_some() && e.destination.is_some() {
        errs.push(
            "UpstreamConfig and Destination are mutually exclusive for service defaults".into(),
        );
        return Err(invalid(errs.join("; ")));
    }
    if let Some(uc) = &e.upstream_config {
        for o in &uc.overrides {
            if let Err(m) = validate_upstream_config(o, true) {
                errs.push(format!("error in upstream override for {:?}: {m}", o.name));
            }
        }
        if let Some(d) = &uc.defaults
            && let Err(m) = validate_upstream_config(d, false)
        {
            errs.push(format!("error in upstream defaults: {m}"));
        }
    }
    if let Some(dest) = &e.destination {
        if dest.addresses.is_empty() {
            errs.push("Destination must contain at least one valid address".into());
        }
        let mut seen = std::collections::HashSet::new();
        for a in &dest.addresses {
            if !seen.insert(a) {
                errs.push(format!("Duplicate address '{a}' is not allowed"));
            } else if !valid_endpoint_address(a) {
                errs.push(format!(
                    "Destination address '{a}' is invalid Could not validate address {a} as an IP or Hostname"
                ));
            }
        }
        if !(1..=65535).contains(&dest.port) {
            errs.push(format!("Invalid Port number {}", dest.port));
        }
    }
    for (what, v) in [
        ("MaxInboundConnections", e.max_inbound_connections),
        ("LocalConnectTimeoutMs", e.local_connect_timeout_ms),
        ("LocalRequestTimeoutMs", e.local_request_timeout_ms),
    ] {
        if v < 0 {
            errs.push(format!("invalid value for {what}: {v}, must be >= 0"));
        }
    }
    for r in [
        validate_proxy_mode(&e.mode),
        validate_outbound_port(&e.transparent_proxy),
        validate_mesh_gateway(&e.mesh_gateway),
        validate_mutual_tls_mode(&e.mutual_tls_mode),
        validate_envoy_extensions(&e.envoy_extensions),
    ] {
        if let Err(err) = r {
            errs.push(err.to_string());
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(invalid(errs.join("; ")))
    }
}

fn valid_endpoint_address(a: &str) -> bool {
    if a.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    // A DNS name: dot-separated labels of at most 63 bytes, no wildcards.
    !a.is_empty()
        && a.len() <= 253
        && !a.contains('*')
        && a.trim_end_matches('.')
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && !l.contains(char::is_whitespace))
}

fn validate_upstream_config(c: &UpstreamConfig, named: bool) -> std::result::Result<(), String> {
    if named {
        if c.name.is_empty() {
            return Err("Name is required".into());
        }
        if c.name == "*" {
            return Err("Wildcard name is not supported".into());
        }
        if c.namespace == "*" {
            return Err("Wildcard namespace is not supported".into());
        }
    } else {
        if !c.name.is_empty() {
            return Err("Name must be empty".into());
        }
        if !c.namespace.is_empty() {
            return Err("Namespace must be empty".into());
        }
        if !c.partition.is_empty() {
            return Err("Partition must be empty".into());
        }
    }
    let mut errs = Vec::new();
    if let Some(p) = &c.passive_health_check {
        if p.interval.nanos() < 0 {
            errs.push("passive health check interval cannot be negative".to_string());
        }
        if p.base_ejection_time.is_some_and(|d| d.nanos() < 0) {
            errs.push("passive health check base ejection time cannot be negative".into());
        }
    }
    if let Some(l) = &c.limits {
        for (what, v) in [
            ("max connections", l.max_connections),
            ("max pending requests", l.max_pending_requests),
            ("max concurrent requests", l.max_concurrent_requests),
        ] {
            if v.is_some_and(|v| v < 0) {
                errs.push(format!("{what} cannot be negative"));
            }
        }
    }
    if !valid_connection_balance(&c.balance_outbound_connections) {
        errs.push(format!(
            "invalid value for balance_outbound_connections: {}",
            c.balance_outbound_connections
        ));
    }
    if let Err(e) = validate_mesh_gateway(&c.mesh_gateway) {
        errs.push(e.to_string());
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

fn validate_router(e: &ServiceRouterConfigEntry) -> Result {
    for (i, route) in e.routes.iter().enumerate() {
        let mut eligible_for_prefix_rewrite = false;
        if let Some(http) = route.match_.as_ref().and_then(|m| m.http.as_ref()) {
            let mut path_parts = 0;
            if !http.path_exact.is_empty() {
                eligible_for_prefix_rewrite = true;
                path_parts += 1;
                if !http.path_exact.starts_with('/') {
                    return Err(invalid(format!(
                        "Route[{i}] PathExact doesn't start with '/': {:?}",
                        http.path_exact
                    )));
                }
            }
            if !http.path_prefix.is_empty() {
                eligible_for_prefix_rewrite = true;
                path_parts += 1;
                if !http.path_prefix.starts_with('/') {
                    return Err(invalid(format!(
                        "Route[{i}] PathPrefix doesn't start with '/': {:?}",
                        http.path_prefix
                    )));
                }
            }
            if !http.path_regex.is_empty() {
                path_parts += 1;
            }
            if path_parts > 1 {
                return Err(invalid(format!(
                    "Route[{i}] should only contain at most one of PathExact, PathPrefix, or PathRegex"
                )));
            }
            for (j, h) in http.header.iter().enumerate() {
                if h.name.is_empty() {
                    return Err(invalid(format!(
                        "Route[{i}] Header[{j}] missing required Name field"
                    )));
                }
                let parts = [
                    h.present,
                    !h.exact.is_empty(),
                    !h.regex.is_empty(),
                    !h.prefix.is_empty(),
                    !h.suffix.is_empty(),
                ]
                .iter()
                .filter(|b| **b)
                .count();
                if parts != 1 {
                    return Err(invalid(format!(
                        "Route[{i}] Header[{j}] should only contain one of Present, Exact, Prefix, Suffix, or Regex"
                    )));
                }
            }
            for (j, q) in http.query_param.iter().enumerate() {
                if q.name.is_empty() {
                    return Err(invalid(format!(
                        "Route[{i}] QueryParam[{j}] missing required Name field"
                    )));
                }
                let parts = [q.present, !q.exact.is_empty(), !q.regex.is_empty()]
                    .iter()
                    .filter(|b| **b)
                    .count();
                if parts != 1 {
                    return Err(invalid(format!(
                        "Route[{i}] QueryParam[{j}] should only contain one of Present, Exact, or Regex"
                    )));
                }
            }
            let mut seen = std::collections::HashSet::new();
            for m in &http.methods {
                const METHODS: [&str; 9] = [
                    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE",
                ];
                if !METHODS.contains(&m.as_str()) {
                    return Err(invalid(format!(
                        "Route[{i}] Methods contains an invalid method {m:?}"
                    )));
                }
                if !seen.insert(m) {
                    return Err(invalid(format!(
                        "Route[{i}] Methods contains {m:?} more than once"
                    )));
                }
            }
        }
        if let Some(dest) = &route.destination {
            if !dest.prefix_rewrite.is_empty() && !eligible_for_prefix_rewrite {
                return Err(invalid(format!(
                    "Route[{i}] cannot make use of PrefixRewrite without configuring either PathExact or PathPrefix"
                )));
            }
            for r in &dest.retry_on {
                if !valid_retry_condition(r) {
                    return Err(invalid(format!(
                        "Route[{i}] contains an invalid retry condition: {r:?}"
                    )));
                }
            }
            if dest.request_timeout.nanos() < 0 || dest.idle_timeout.nanos() < 0 {
                return Err(invalid(format!("Route[{i}] timeouts must be >= 0")));
            }
        }
    }
    Ok(())
}

fn valid_retry_condition(r: &str) -> bool {
    matches!(
        r,
        "5xx"
            | "gateway-error"
            | "reset"
            | "connect-failure"
            | "envoy-ratelimited"
            | "retriable-4xx"
            | "refused-stream"
            | "cancelled"
            | "deadline-exceeded"
            | "internal"
            | "resource-exhausted"
            | "unavailable"
    )
}

fn validate_splitter(e: &ServiceSplitterConfigEntry) -> Result {
    if e.splits.is_empty() {
        return Err(invalid("no splits configured"));
    }
    // Consul keys duplicates on the whole split minus its weight; splits that
    // edit headers never compare equal there, so they are never duplicates.
    let mut seen = std::collections::HashSet::new();
    for s in &e.splits {
        let service = if s.service.is_empty() {
            &e.name
        } else {
            &s.service
        };
        let key = (service, &s.service_subset, &s.namespace, &s.partition);
        let plain = s.request_headers.is_none() && s.response_headers.is_none();
        if plain && !seen.insert(key) {
            return Err(invalid(format!(
                "split destination occurs more than once: service={service:?}, subset={:?}, namespace={:?}, partition={:?}",
                s.service_subset, s.namespace, s.partition
            )));
        }
    }
    // Wide enough that absurd weights cannot overflow the sum.
    let sum: i128 = e
        .splits
        .iter()
        .map(|s| i128::from(scale_weight(s.weight)))
        .sum();
    if sum != 100 * 100 {
        return Err(invalid(format!(
            "the sum of all split weights must be 100, not {:.6}",
            sum as f32 / 100.0
        )));
    }
    Ok(())
}

/// Subset names end up in SNI, so they must be DNS labels.
static VALID_SUBSET: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$").expect("valid regex"));

fn validate_subset_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 63 {
        return Err("must be non-empty and 63 characters or fewer");
    }
    if !VALID_SUBSET.is_match(name) {
        return Err(
            "must be 63 characters or fewer, begin or end with lower case alphanumeric characters, and contain lower case alphanumeric characters or '-' in between",
        );
    }
    Ok(())
}

fn validate_resolver(e: &ServiceResolverConfigEntry) -> Result {
    for (name, subset) in &e.subsets {
        if name.is_empty() {
            return Err(invalid("Subset defined with empty name"));
        }
        if let Err(m) = validate_subset_name(name) {
            return Err(invalid(format!("Subset {name:?} is invalid: {m}")));
        }
        // Syntax only, as Consul (`bexpr.CreateEvaluator(filter, nil)`): a
        // selector the health rows lack is accepted and matches nothing.
        if !subset.filter.is_empty()
            && let Err(m) = crate::filter::Filter::parse(&subset.filter)
        {
            return Err(invalid(format!(
                "Filter for subset {name:?} is not a valid expression: {m}"
            )));
        }
    }
    let is_subset = |s: &str| e.subsets.contains_key(s);

    if !e.default_subset.is_empty() && !is_subset(&e.default_subset) {
        return Err(invalid(format!(
            "DefaultSubset {:?} is not a valid subset",
            e.default_subset
        )));
    }

    if let Some(r) = &e.redirect {
        if !e.failover.is_empty() {
            return Err(invalid("Redirect and Failover cannot both be set"));
        }
        if r.is_empty() {
            return Err(invalid("Redirect is empty"));
        }
        let msg = if !r.peer.is_empty() && !r.service_subset.is_empty() {
            Some("Redirect.Peer cannot be set with Redirect.ServiceSubset".to_string())
        } else if !r.peer.is_empty() && !r.partition.is_empty() {
            Some("Redirect.Partition cannot be set with Redirect.Peer".into())
        } else if !r.peer.is_empty() && !r.datacenter.is_empty() {
            Some("Redirect.Peer cannot be set with Redirect.Datacenter".into())
        } else if r.service.is_empty() {
            [
                (&r.service_subset, "ServiceSubset"),
                (&r.namespace, "Namespace"),
                (&r.partition, "Partition"),
                (&r.peer, "Peer"),
            ]
            .into_iter()
            .find(|(v, _)| !v.is_empty())
            .map(|(_, f)| format!("Redirect.{f} defined without Redirect.Service"))
        } else if !r.service_subset.is_empty()
            && r.service == e.name
            && !is_subset(&r.service_subset)
        {
            Some(format!(
                "Redirect.ServiceSubset {:?} is not a valid subset of {:?}",
                r.service_subset, e.name
            ))
        } else {
            None
        };
        if let Some(m) = msg {
            return Err(invalid(m));
        }
    }

    for (subset, f) in &e.failover {
        let prefix = format!("Bad Failover[{subset:?}]: ");
        if subset != "*" && !is_subset(subset) {
            // Consul's wording, doubled word included.
            return Err(invalid(format!("{prefix}not a valid subset subset")));
        }
        if f.is_empty() {
            return Err(invalid(format!(
                "{prefix}one of Service, ServiceSubset, Namespace, Targets, or Datacenters is required"
            )));
        }
        if let Some(p) = &f.policy {
            validate_failover_policy_mode(&p.mode).map_err(|m| invalid(format!("{prefix}{m}")))?;
        }
        if !f.service_subset.is_empty()
            && (f.service.is_empty() || f.service == e.name)
            && !is_subset(&f.service_subset)
        {
            return Err(invalid(format!(
                "{prefix}ServiceSubset {:?} is not a valid subset of {:?}",
                f.service_subset, f.service
            )));
        }
        if !f.datacenters.is_empty() && !f.targets.is_empty() {
            return Err(invalid(format!(
                "{prefix}Targets cannot be set with Datacenters"
            )));
        }
        if !f.service_subset.is_empty() && !f.targets.is_empty() {
            return Err(invalid(format!(
                "{prefix}Targets cannot be set with ServiceSubset"
            )));
        }
        if !f.service.is_empty() && !f.targets.is_empty() {
            return Err(invalid(format!(
                "{prefix}Targets cannot be set with Service"
            )));
        }
        for (i, t) in f.targets.iter().enumerate() {
            let tp = format!("Bad Failover[{subset:?}].Targets[{i}]: ");
            let msg = if !t.peer.is_empty() && !t.service_subset.is_empty() {
                Some("Peer cannot be set with ServiceSubset".to_string())
            } else if !t.peer.is_empty() && !t.partition.is_empty() {
                Some("Partition cannot be set with Peer".into())
            } else if !t.peer.is_empty() && !t.datacenter.is_empty() {
                Some("Peer cannot be set with Datacenter".into())
            } else if !t.partition.is_empty() && !t.datacenter.is_empty() {
                Some("Partition cannot be set with Datacenter".into())
            } else if !t.service_subset.is_empty()
                && (t.service.is_empty() || t.service == e.name)
                && !is_subset(&t.service_subset)
            {
                Some(format!(
                    "ServiceSubset {:?} is not a valid subset of {:?}",
                    t.service_subset, e.name
                ))
            } else {
                None
            };
            if let Some(m) = msg {
                return Err(invalid(format!("{tp}{m}")));
            }
        }
        if f.datacenters.iter().any(String::is_empty) {
            return Err(invalid(format!(
                "Bad Failover[{subset:?}].Datacenters: found empty datacenter"
            )));
        }
    }

    if e.connect_timeout.nanos() < 0 {
        return Err(invalid(format!(
            "Bad ConnectTimeout '{}', must be >= 0",
            e.connect_timeout
        )));
    }
    if e.request_timeout.nanos() < 0 {
        return Err(invalid(format!(
            "Bad RequestTimeout '{}', must be >= 0",
            e.request_timeout
        )));
    }
    if let Some(lb) = &e.load_balancer {
        validate_load_balancer(lb)?;
    }
    Ok(())
}

fn validate_load_balancer(lb: &LoadBalancer) -> Result {
    let policy = lb.policy.as_str();
    if !matches!(
        policy,
        "" | "random" | "round_robin" | "least_request" | "ring_hash" | "maglev"
    ) {
        return Err(invalid(format!(
            "Bad LoadBalancer policy: {policy:?} is not supported"
        )));
    }
    if policy != "ring_hash" && lb.ring_hash_config.is_some() {
        return Err(invalid(format!(
            "Bad LoadBalancer configuration. RingHashConfig specified for incompatible load balancing policy {policy:?}"
        )));
    }
    if policy != "least_request" && lb.least_request_config.is_some() {
        return Err(invalid(format!(
            "Bad LoadBalancer configuration. LeastRequestConfig specified for incompatible load balancing policy {policy:?}"
        )));
    }
    if !lb.is_hash_based() && !lb.hash_policies.is_empty() {
        return Err(invalid(format!(
            "Bad LoadBalancer configuration: HashPolicies specified for non-hash-based Policy: {policy:?}"
        )));
    }
    for (i, hp) in lb.hash_policies.iter().enumerate() {
        let p = format!("Bad LoadBalancer HashPolicy[{i}]: ");
        let field = hp.field.as_str();
        let msg = if !field.is_empty() && !matches!(field, "header" | "cookie" | "query_parameter")
        {
            Some(format!("{field:?} is not a supported field"))
        } else if hp.source_ip && !field.is_empty() {
            Some(format!(
                "A single hash policy cannot hash both a source address and a {field:?}"
            ))
        } else if hp.source_ip && !hp.field_value.is_empty() {
            Some("A FieldValue cannot be specified when hashing SourceIP".into())
        } else if !field.is_empty() && hp.field_value.is_empty() {
            Some(format!(
                "Field {field:?} was specified without a FieldValue"
            ))
        } else if !hp.field_value.is_empty() && field.is_empty() {
            Some("FieldValue requires a Field to apply to".into())
        } else if let Some(c) = &hp.cookie_config {
            if field != "cookie" {
                Some(format!("cookie_config provided for {field:?}"))
            } else if c.session && !c.ttl.is_zero() {
                Some("a session cookie cannot have an associated TTL".into())
            } else {
                None
            }
        } else {
            None
        };
        if let Some(m) = msg {
            return Err(invalid(format!("{p}{m}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config_check::decode_and_validate;
    use serde_json::json;

    fn err_of(body: serde_json::Value) -> String {
        decode_and_validate(&body).unwrap_err().to_string()
    }

    #[test]
    fn proxy_defaults_name() {
        assert!(
            err_of(json!({"Kind": "proxy-defaults", "Name": "foo"}))
                .contains(r#"invalid name ("foo"), only "global" is supported"#)
        );
        let e = decode_and_validate(&json!({"Kind": "proxy-defaults"})).unwrap();
        assert_eq!(e.name(), "global");
    }

    #[test]
    fn resolver_subset_filters_are_checked_for_syntax_only() {
        let resolver = |filter: &str| {
            json!({"Kind": "service-resolver", "Name": "db",
                   "Subsets": {"prod": {"Filter": filter}}})
        };
        assert!(
            err_of(resolver("Service.Meta.env =="))
                .contains(r#"Filter for subset "prod" is not a valid expression"#)
        );
        assert!(
            err_of(resolver("Service.Meta.env == prod and")).contains("not a valid expression")
        );
        // Consul accepts selectors the health rows do not know
        // (`bexpr.CreateEvaluator(filter, nil)`); they match nothing later.
        decode_and_validate(&resolver("ServiceMeta.env == prod")).unwrap();
        decode_and_validate(&resolver("Bogus.Field != x")).unwrap();
    }

    #[test]
    fn tenancy_only_default() {
        decode_and_validate(&json!({"Kind": "service-defaults", "Name": "a", "Namespace": "default", "Partition": ""})).unwrap();
        assert!(
            err_of(json!({"Kind": "service-defaults", "Name": "a", "Namespace": "team"}))
                .contains("Namespace")
        );
    }

    #[test]
    fn service_defaults_rules() {
        let e = decode_and_validate(&json!({"Kind": "service-defaults", "Name": "web", "Protocol": "HTTP",
            "UpstreamConfig": {"Overrides": [{"Name": "db", "Protocol": "GRPC", "ConnectTimeoutMs": -5}]}})).unwrap();
        let sd = e.as_service_defaults().unwrap();
        assert_eq!(sd.protocol, "http");
        let o = &sd.upstream_config.as_ref().unwrap().overrides[0];
        assert_eq!((o.protocol.as_str(), o.connect_timeout_ms), ("grpc", 0));
        assert!(err_of(json!({"Kind": "service-defaults", "Name": "*"})).contains("wildcard"));
        assert!(
            err_of(json!({"Kind": "service-defaults", "Name": "w", "Mode": "weird"}))
                .contains("proxy mode")
        );
        assert!(
            err_of(json!({"Kind": "service-defaults", "Name": "w", "MeshGateway": {"Mode": "x"}}))
                .contains("mesh gateway")
        );
        assert!(err_of(json!({"Kind": "service-defaults", "Name": "w", "Destination": {"Addresses": ["a.com", "a.com"], "Port": 443}})).contains("Duplicate address"));
        assert!(err_of(json!({"Kind": "service-defaults", "Name": "w", "Destination": {"Addresses": ["a.com"], "Port": 0}})).contains("Invalid Port"));
        assert!(err_of(json!({"Kind": "service-defaults", "Name": "w", "UpstreamConfig": {"Defaults": {"Limits": {"MaxPendingRequests": -1}}}})).contains("max pending requests cannot be negative"));
    }

    #[test]
    fn router_rules() {
        let base = |route: serde_json::Value| {
            err_of(json!({"Kind": "service-router", "Name": "r", "Routes": [route]}))
        };
        assert!(
            base(json!({"Match": {"HTTP": {"PathPrefix": "x"}}}))
                .contains("PathPrefix doesn't start with '/'")
        );
        assert!(
            base(json!({"Match": {"HTTP": {"Methods": ["GET", "get"]}}}))
                .contains("more than once")
        );
        assert!(
            base(json!({"Match": {"HTTP": {"Methods": ["FETCH"]}}})).contains("invalid method")
        );
        assert!(base(json!({"Match": {"HTTP": {"QueryParam": [{"Name": "a", "Exact": "1", "Regex": "x"}]}}})).contains("one of Present, Exact, or Regex"));
        let ok = decode_and_validate(&json!({"Kind": "service-router", "Name": "r",
            "Routes": [{"Match": {"HTTP": {"PathPrefix": "/a", "Methods": ["get"]}}, "Destination": {"PrefixRewrite": "/", "RetryOn": ["5xx"]}}]})).unwrap();
        let m = ok.as_router().unwrap().routes[0]
            .match_
            .as_ref()
            .unwrap()
            .http
            .as_ref()
            .unwrap();
        assert_eq!(m.methods, vec!["GET"]);
    }

    #[test]
    fn splitter_rules() {
        assert!(
            err_of(json!({"Kind": "service-splitter", "Name": "s"}))
                .contains("no splits configured")
        );
        decode_and_validate(&json!({"Kind": "service-splitter", "Name": "s",
            "Splits": [{"Weight": 33.33, "ServiceSubset": "a"}, {"Weight": 33.33, "ServiceSubset": "b"}, {"Weight": 33.34, "ServiceSubset": "c"}]})).unwrap();
        // Same destination but with header edits is not a duplicate.
        decode_and_validate(&json!({"Kind": "service-splitter", "Name": "s",
            "Splits": [{"Weight": 50}, {"Weight": 50, "RequestHeaders": {"Set": {"x": "1"}}}]}))
        .unwrap();
        assert!(err_of(json!({"Kind": "service-splitter", "Name": "s", "Splits": [{"Weight": 50}, {"Weight": 50, "Service": "s"}]}))
            .contains("occurs more than once"));
    }

    #[test]
    fn resolver_rules() {
        let r = |extra: serde_json::Value| {
            let mut b = json!({"Kind": "service-resolver", "Name": "test"});
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            err_of(b)
        };
        assert!(
            r(json!({"Redirect": {"Service": "x"}, "Failover": {"*": {"Service": "y"}}}))
                .contains("cannot both be set")
        );
        assert!(
            r(json!({"Redirect": {"Service": "test", "ServiceSubset": "nope"}}))
                .contains("is not a valid subset of \"test\"")
        );
        assert!(
            r(json!({"Failover": {"*": {"Datacenters": [""]}}})).contains("found empty datacenter")
        );
        assert!(
            r(json!({"Failover": {"*": {"Service": "a", "Targets": [{"Service": "b"}]}}}))
                .contains("Targets cannot be set with Service")
        );
        assert!(
            r(json!({"Failover": {"*": {"Service": "a", "Policy": {"Mode": "odd"}}}}))
                .contains("Policy must be one of")
        );
        assert!(r(json!({"ConnectTimeout": "-1s"})).contains("Bad ConnectTimeout '-1s'"));
        assert!(
            r(json!({"LoadBalancer": {"Policy": "random", "RingHashConfig": {}}}))
                .contains("RingHashConfig specified")
        );
        assert!(r(json!({"LoadBalancer": {"Policy": "maglev", "HashPolicies": [{"Field": "body", "FieldValue": "x"}]}})).contains("is not a supported field"));
        assert!(
            r(json!({"Subsets": {"v1": {"Filter": "Service.Meta.version =="}}}))
                .contains("not a valid expression")
        );
    }
}
