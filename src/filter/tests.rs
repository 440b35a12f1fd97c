//! Tests for the filter module: parsing, precedence, quoting, coercion,
//! list/map semantics, errors with positions, schema validation, and a
//! deterministic fuzz pass checking that no input panics.

use serde_json::{Value, json};

use super::ast::MatchOp;
use super::schemas;
use super::*;

// ---------------------------------------------------------------- helpers

fn parse(s: &str) -> Filter {
    Filter::parse(s).unwrap_or_else(|e| panic!("parse {s:?} failed: {e}"))
}

/// Canonical rendering of the parsed tree (fully parenthesised).
fn canon(s: &str) -> String {
    parse(s).expr().to_string()
}

fn parse_err(s: &str) -> String {
    match Filter::parse(s) {
        Ok(f) => panic!("parse {s:?} unexpectedly succeeded: {}", f.expr()),
        Err(e) => e.to_string(),
    }
}

/// Evaluates without a schema.
fn eval(s: &str, row: &Value) -> bool {
    parse(s)
        .evaluate(row)
        .unwrap_or_else(|e| panic!("eval {s:?} failed: {e}"))
}

/// Parses against the /v1/health/service schema and evaluates.
fn eval_health(s: &str, row: &Value) -> bool {
    Filter::parse_for(s, &schemas::HEALTH_SERVICE)
        .unwrap_or_else(|e| panic!("parse_for {s:?} failed: {e}"))
        .evaluate(row)
        .unwrap_or_else(|e| panic!("eval {s:?} failed: {e}"))
}

fn validate_err(s: &str, schema: &Schema) -> String {
    match parse(s).validate(schema) {
        Ok(()) => panic!("validate {s:?} unexpectedly succeeded"),
        Err(e) => e.to_string(),
    }
}

/// A /v1/health/service row.
fn health_row() -> Value {
    json!({
        "Node": {
            "ID": "40e4a748-2192-161a-0510-9bf59fe950b5",
            "Node": "node1",
            "Address": "10.1.10.12",
            "Datacenter": "dc1",
            "TaggedAddresses": {"lan": "10.1.10.12", "wan": "198.18.0.1"},
            "Meta": {"rack id": "r1", "env": "prod"}
        },
        "Service": {
            "ID": "web-1",
            "Service": "web",
            "Tags": ["v1", "canary"],
            "Address": "",
            "Meta": {"version": "v1", "owner": "team-a"},
            "Port": 8080,
            "Weights": {"Passing": 10, "Warning": 1},
            "EnableTagOverride": false,
            "Proxy": {
                "DestinationServiceName": "",
                "LocalServicePort": 0,
                "Upstreams": [
                    {"DestinationName": "db", "LocalBindPort": 9191},
                    {"DestinationName": "cache", "LocalBindPort": 9292}
                ]
            },
            "Connect": {"Native": false}
        },
        "Checks": [
            {"Node": "node1", "CheckID": "serfHealth", "Status": "passing", "ServiceTags": []},
            {"Node": "node1", "CheckID": "service:web-1", "Status": "critical",
             "ServiceID": "web-1", "ServiceTags": ["v1"]}
        ]
    })
}

/// A /v1/catalog/service row (flat ServiceNode).
fn catalog_row() -> Value {
    json!({
        "ID": "40e4a748",
        "Node": "t2.320",
        "Address": "192.168.10.10",
        "Datacenter": "dc1",
        "TaggedAddresses": {"lan": "192.168.10.10"},
        "NodeMeta": {},
        "ServiceKind": "",
        "ServiceID": "web-5000",
        "ServiceName": "web",
        "ServiceTags": ["prod", "primary"],
        "ServiceAddress": "172.17.0.3",
        "ServiceTaggedAddresses": {"wan": {"Address": "198.18.0.1", "Port": 512}},
        "ServiceMeta": {"version": "v2"},
        "ServicePort": 5000,
        "ServiceWeights": {"Passing": 1, "Warning": 1},
        "ServiceEnableTagOverride": true,
        "ServiceProxy": {"DestinationServiceName": "", "Upstreams": null, "Config": null},
        "ServiceConnect": {"Native": false},
        "CreateIndex": 51,
        "ModifyIndex": 51
    })
}

// ---------------------------------------------------------------- parsing

#[test]
fn parses_each_operator() {
    assert_eq!(canon("Status == passing"), "Status == `passing`");
    assert_eq!(canon("Status != passing"), "Status != `passing`");
    assert_eq!(canon("v1 in Tags"), "`v1` in Tags");
    assert_eq!(canon("v1 not in Tags"), "`v1` not in Tags");
    assert_eq!(canon("Tags contains v1"), "`v1` in Tags");
    assert_eq!(canon("Tags not contains v1"), "`v1` not in Tags");
    assert_eq!(canon("Name matches `^w`"), "Name matches `^w`");
    assert_eq!(canon("Name not matches `^w`"), "Name not matches `^w`");
    assert_eq!(canon("Tags is empty"), "Tags is empty");
    assert_eq!(canon("Tags is not empty"), "Tags is not empty");
}

#[test]
fn contains_and_in_are_the_same_test() {
    let row = json!({"Tags": ["a", "b"]});
    for (a, b) in [
        ("Tags contains a", "a in Tags"),
        ("Tags not contains a", "a not in Tags"),
        ("Tags contains z", "z in Tags"),
    ] {
        assert_eq!(canon(a), canon(b));
        assert_eq!(eval(a, &row), eval(b, &row));
    }
}

#[test]
fn precedence_not_over_and_over_or() {
    assert_eq!(
        canon("a == 1 or b == 2 and c == 3"),
        "(a == `1` or (b == `2` and c == `3`))"
    );
    assert_eq!(
        canon("a == 1 and b == 2 or c == 3"),
        "((a == `1` and b == `2`) or c == `3`)"
    );
    assert_eq!(
        canon("not a == 1 and b == 2"),
        "((not a == `1`) and b == `2`)"
    );
    assert_eq!(
        canon("not a == 1 or not b == 2 and c == 3"),
        "((not a == `1`) or ((not b == `2`) and c == `3`))"
    );
}

#[test]
fn precedence_is_observable_in_evaluation() {
    let row = json!({"a": "1", "b": "0", "c": "0"});
    // a or (b and c) = true; (a or b) and c = false.
    assert!(eval("a == 1 or b == 2 and c == 3", &row));
    assert!(!eval("(a == 1 or b == 2) and c == 3", &row));
    // (not a) and b = false; not (a and b) = true.
    assert!(!eval("not a == 1 and b == 0", &row));
    assert!(eval("not (a == 1 and b == 1)", &row));
}

#[test]
fn parentheses_group_and_nest() {
    assert_eq!(
        canon("(a == 1 or b == 2) and c == 3"),
        "((a == `1` or b == `2`) and c == `3`)"
    );
    assert_eq!(canon("((((a == 1))))"), "a == `1`");
    assert_eq!(canon("( a == 1 )"), "a == `1`");
    assert_eq!(
        canon("not (a == 1 or (b == 2 and not c is empty))"),
        "(not (a == `1` or (b == `2` and (not c is empty))))"
    );
}

#[test]
fn chains_are_flat_and_double_not_cancels() {
    assert_eq!(
        canon("a == 1 and b == 2 and c == 3"),
        "(a == `1` and b == `2` and c == `3`)"
    );
    assert_eq!(
        canon("a == 1 or b == 2 or c == 3"),
        "(a == `1` or b == `2` or c == `3`)"
    );
    assert_eq!(canon("not not a == 1"), "a == `1`");
    assert_eq!(canon("not not not a == 1"), "(not a == `1`)");
}

#[test]
fn whitespace_is_flexible_where_bexpr_allows_it() {
    assert_eq!(canon("a==1"), "a == `1`");
    assert_eq!(canon("a!=b"), "a != `b`");
    assert_eq!(
        canon("  \t\na == 1\r\n  and\n\tb is empty  "),
        "(a == `1` and b is empty)"
    );
    assert_eq!(canon("(a==1)"), "a == `1`");
    assert_eq!(canon("a[ \"k\" ] == 1"), "a.k == `1`");
}

#[test]
fn selectors_dotted_indexed_and_numeric() {
    let f = parse(r#"Node.Meta["rack id"] == r1"#);
    let Expr::Match(m) = f.expr() else {
        panic!("not a match")
    };
    assert_eq!(m.selector.path, ["Node", "Meta", "rack id"]);
    assert_eq!(m.selector.to_string(), r#"Node.Meta[`rack id`]"#);
    assert_eq!(m.selector.dotted(), "Node.Meta.rack id");

    let f = parse("Service.Meta[`a.b`] == x");
    let Expr::Match(m) = f.expr() else {
        panic!("not a match")
    };
    assert_eq!(m.selector.path, ["Service", "Meta", "a.b"]);

    // Identifiers may contain digits and underscores after the first letter.
    assert_eq!(canon("Meta.k_1.x2 == y"), "Meta.k_1.x2 == `y`");
}

#[test]
fn bare_word_values_are_dotted_selector_text() {
    // bexpr reads an unquoted value as a selector and uses its text, so
    // versions work unquoted.
    assert_eq!(canon("Meta.version == v1.2.3"), "Meta.version == `v1.2.3`");
    assert_eq!(canon("Meta.x == a_b"), "Meta.x == `a_b`");
    assert_eq!(canon(r#"Meta.x == a["b c"]"#), "Meta.x == `a.b c`");
}

#[test]
fn numbers_are_kept_as_text() {
    assert_eq!(canon("Port == 8080"), "Port == `8080`");
    assert_eq!(canon("Port == -1"), "Port == `-1`");
    assert_eq!(canon("Score == 1.5"), "Score == `1.5`");
    assert_eq!(canon("Port == 0"), "Port == `0`");
    assert_eq!(canon("(Port == 1)"), "Port == `1`");
    assert_eq!(canon("-1 in Ports"), "`-1` in Ports");
}

#[test]
fn double_quoted_strings_process_go_escapes() {
    let value = |s: &str| match parse(s).expr() {
        Expr::Match(m) => m.value.clone().unwrap(),
        other => panic!("not a match: {other}"),
    };
    assert_eq!(value(r#"a == "x y""#), "x y");
    assert_eq!(value(r#"a == "tab\there""#), "tab\there");
    assert_eq!(value(r#"a == "nl\nr\r""#), "nl\nr\r");
    assert_eq!(value(r#"a == "q\"uote""#), "q\"uote");
    assert_eq!(value(r#"a == "back\\slash""#), "back\\slash");
    assert_eq!(value(r#"a == "\x41\101\u00e9\U0001F600""#), "AAé😀");
    assert_eq!(value(r#"a == "\a\b\f\v""#), "\u{7}\u{8}\u{c}\u{b}");
    assert_eq!(value(r#"a == """#), "");
    assert_eq!(value(r#"a == "ünïcödé""#), "ünïcödé");
}

#[test]
fn backtick_strings_are_raw() {
    let value = |s: &str| match parse(s).expr() {
        Expr::Match(m) => m.value.clone().unwrap(),
        other => panic!("not a match: {other}"),
    };
    assert_eq!(value(r"a == `\d+\n`"), r"\d+\n");
    assert_eq!(value("a == `two\nlines`"), "two\nlines");
    // Go's Unquote drops carriage returns from raw strings.
    assert_eq!(value("a == `cr\r\nlf`"), "cr\nlf");
    assert_eq!(value(r#"a == `has "quotes"`"#), r#"has "quotes""#);
}

#[test]
fn keywords_can_still_be_selectors_and_values() {
    // bexpr's PEG backtracks, so `not` works as a selector or bare value.
    assert_eq!(canon("not == x"), "not == `x`");
    assert_eq!(canon("x == not"), "x == `not`");
    assert_eq!(canon("Tags contains and"), "`and` in Tags");
    assert_eq!(canon("in in Tags"), "`in` in Tags");
    // `not not in Tags` is `not ("not" in Tags)`, as bexpr's PEG reads it.
    assert_eq!(canon("not not in Tags"), "(not `not` in Tags)");
    assert_eq!(canon("not is empty"), "not is empty");
}

#[test]
fn display_round_trips() {
    for src in [
        r#"Node.Meta["rack id"] == "r\"1" and not (a is empty or "x" not in b)"#,
        "a matches `^(x|y)$` or b not matches \"\\\\d\"",
        "a == `back``tick`".replace("``", "\\`").as_str(),
        "a == \"cr\\rlf\"",
        "a.b.c != 3 and d is not empty and e contains f",
    ] {
        let Ok(f) = Filter::parse(src) else { continue };
        let once = f.expr().to_string();
        let twice = parse(&once).expr().to_string();
        assert_eq!(once, twice, "round trip of {src:?}");
    }
}

#[test]
fn filter_api_conveniences() {
    let f: Filter = "a == 1".parse().unwrap();
    assert_eq!(f.source(), "a == 1");
    assert_eq!(f.to_string(), "a == 1");
    assert!(f.schema().is_none());
    assert!(Filter::parse_optional("").unwrap().is_none());
    assert!(Filter::parse_optional("a == 1").unwrap().is_some());
    assert!(Filter::parse_optional(" ").is_err());

    #[derive(serde::Serialize)]
    struct Row {
        #[serde(rename = "Port")]
        port: u16,
    }
    assert!(parse("Port == 80").evaluate_row(&Row { port: 80 }).unwrap());

    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Filter>();
}

// ---------------------------------------------------------------- parse errors

#[test]
fn parse_errors_name_the_problem_and_position() {
    assert_eq!(parse_err(""), "1:1 (0): empty filter expression");
    assert_eq!(parse_err("   "), "1:4 (3): empty filter expression");
    assert_eq!(
        parse_err("Service.Port =="),
        "1:16 (15): expected a value, found end of expression"
    );
    assert_eq!(
        parse_err("a = 1"),
        "1:3 (2): unexpected \"=\", did you mean \"==\"?"
    );
    assert_eq!(
        parse_err(r#"a == "abc"#),
        "1:6 (5): Unterminated string literal"
    );
    assert_eq!(
        parse_err("a == `abc"),
        "1:6 (5): Unterminated string literal"
    );
    assert!(parse_err("a == 1.2.3").starts_with("1:6 (5): Invalid number literal"));
    assert!(parse_err("Address == 10.0.0.1").starts_with("1:12 (11): Invalid number literal"));
    assert!(parse_err("a == 0123").starts_with("1:6 (5): Invalid number literal"));
    assert!(parse_err("a == 5x").contains("Invalid number literal"));
    assert_eq!(parse_err("a == 'x'"), "1:6 (5): unexpected character '\\''");
    assert_eq!(parse_err("a == 1)"), "1:7 (6): unmatched \")\"");
    assert!(parse_err("(a == 1").starts_with("1:8 (7): Unmatched parentheses"));
    assert!(parse_err("((a == 1) and b == 2").starts_with("1:21 (20): Unmatched parentheses"));
    assert_eq!(
        parse_err("a == 1 b == 2"),
        "1:8 (7): unexpected \"b\", expected \"and\", \"or\" or end of expression"
    );
    assert_eq!(
        parse_err("a == 1 and"),
        "1:11 (10): unexpected end of expression, expected a selector, value or \"(\""
    );
    assert_eq!(
        parse_err("a is"),
        "1:5 (4): expected \"empty\" after \"is\""
    );
    assert_eq!(
        parse_err("a is not"),
        "1:9 (8): expected \"empty\" after \"is not\""
    );
    assert!(parse_err("a foo b").starts_with("1:3 (2): unexpected \"foo\" after selector \"a\""));
    assert!(parse_err(r#""x" == a"#).starts_with("1:5 (4): unexpected \"==\" after value"));
    assert!(parse_err("5 contains a").contains("expected \"in\" or \"not in\""));
    assert_eq!(
        parse_err(r#""x" in 5"#),
        "1:8 (7): Invalid selector: expected a selector, found number 5"
    );
    assert_eq!(
        parse_err(r#"a["x" == 1"#),
        "1:2 (1): Unclosed index expression"
    );
    assert_eq!(
        parse_err("a[x] == 1"),
        "1:2 (1): Invalid index: expected a quoted map key"
    );
    assert_eq!(
        parse_err("== 1"),
        "1:1 (0): unexpected \"==\", expected a selector, value or \"(\""
    );
    assert_eq!(
        parse_err("a == 1 and )"),
        "1:12 (11): unexpected \")\", expected a selector, value or \"(\""
    );
}

#[test]
fn word_operators_need_surrounding_whitespace() {
    assert_eq!(
        parse_err("(a == 1)and(b == 2)"),
        "1:9 (8): expected whitespace before \"and\""
    );
    assert_eq!(
        parse_err("(a == 1) and(b == 2)"),
        "1:13 (12): expected whitespace after \"and\""
    );
    assert_eq!(
        parse_err(r#""x"in a"#),
        "1:4 (3): expected whitespace before \"in\""
    );
    // `empty` ends a match, so a closing parenthesis may follow directly.
    assert_eq!(canon("(a is empty)"), "a is empty");
    assert_eq!(
        parse_err(r#"a contains"x""#),
        "1:11 (10): expected whitespace after \"contains\""
    );
    assert!(Filter::parse("not(a == 1)").is_err());
    assert!(Filter::parse("not (a == 1)").is_ok());
}

#[test]
fn bad_escapes_and_newlines_in_strings_are_errors() {
    assert_eq!(
        parse_err(r#"a == "\q""#),
        "1:7 (6): invalid escape sequence in string literal: \\q"
    );
    assert!(parse_err(r#"a == "\'""#).contains("invalid escape"));
    assert!(parse_err(r#"a == "\x4""#).contains("invalid escape"));
    assert!(parse_err(r#"a == "\xff""#).contains("not valid UTF-8"));
    assert!(parse_err(r#"a == "\uD800""#).contains("not a Unicode scalar value"));
    assert!(parse_err("a == \"two\nlines\"").starts_with("1:10 (9): newline in string literal"));
}

#[test]
fn error_positions_count_lines_and_characters() {
    assert_eq!(
        parse_err("a == 1 and\n  b =="),
        "2:7 (17): expected a value, found end of expression"
    );
    // Columns count characters, offsets count bytes.
    assert_eq!(
        parse_err("a == \"é\" and"),
        "1:13 (13): unexpected end of expression, expected a selector, value or \"(\""
    );
}

#[test]
fn invalid_regex_is_a_parse_time_error() {
    let err = Filter::parse("a matches \"(\"").unwrap_err();
    assert!(matches!(err, FilterError::Regex { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("Failed to compile regular expression \"(\":")
    );
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    let deep = format!("{}a == 1{}", "(".repeat(5000), ")".repeat(5000));
    assert!(parse_err(&deep).contains("nested too deeply"));
    let nots = format!("{}a == 1", "not ".repeat(5000));
    assert!(parse_err(&nots).contains("nested too deeply"));
    // A reasonable depth is fine.
    let ok = format!("{}a == 1{}", "(".repeat(50), ")".repeat(50));
    assert_eq!(canon(&ok), "a == `1`");
}

#[test]
fn long_flat_chains_do_not_recurse() {
    let terms: Vec<String> = (0..20_000).map(|i| format!("a == {i}")).collect();
    let f = parse(&terms.join(" or "));
    assert!(f.evaluate(&json!({"a": 19_999})).unwrap());
    assert!(!f.evaluate(&json!({"a": 20_000})).unwrap());
    let f = parse(&terms.join(" and "));
    assert!(!f.evaluate(&json!({"a": 1})).unwrap());
}

// ---------------------------------------------------------------- evaluation

#[test]
fn equality_on_strings() {
    let row = health_row();
    assert!(eval("Service.Service == web", &row));
    assert!(eval(r#"Service.Service == "web""#, &row));
    assert!(eval("Service.Service == `web`", &row));
    assert!(!eval("Service.Service == Web", &row));
    assert!(eval("Service.Service != api", &row));
    assert!(!eval("Service.Service != web", &row));
    assert!(eval(r#"Service.Address == """#, &row));
    assert!(eval(r#"Node.Meta["rack id"] == r1"#, &row));
}

#[test]
fn numbers_coerce_to_the_field_type() {
    let row = health_row();
    assert!(eval("Service.Port == 8080", &row));
    assert!(eval(r#"Service.Port == "8080""#, &row));
    assert!(eval("Service.Port == `8080`", &row));
    assert!(eval(r#"Service.Port == "0x1f90""#, &row));
    assert!(eval(r#"Service.Port == "8_080""#, &row));
    // Unquoted hex is not a number literal in bexpr's grammar.
    assert!(Filter::parse("Service.Port == 0x1f90").is_err());
    assert!(eval("Service.Port != 80", &row));
    assert!(eval("Service.Weights.Passing == 10", &row));
    // "8080.0" is not an integer: a conversion error, as bexpr reports.
    let err = parse("Service.Port == 8080.0").evaluate(&row).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"Failed to coerce value "8080.0" for selector "Service.Port": "8080.0" is not an integer"#
    );
    assert!(!parse("Service.Port == abc").matches(&row));

    let floats = json!({"Score": 1.5, "Neg": -3});
    assert!(eval("Score == 1.5", &floats));
    assert!(eval(r#"Score == "1.50""#, &floats));
    assert!(!eval("Score == 1", &floats));
    assert!(eval("Neg == -3", &floats));
    assert!(eval(r#"Neg == "-0x3""#, &floats));

    let big = json!({"Index": u64::MAX});
    assert!(eval("Index == 18446744073709551615", &big));
    assert!(!eval("Index == 1", &big));
}

#[test]
fn booleans_coerce_like_go_parse_bool() {
    let row = health_row();
    for v in ["false", "False", "FALSE", "f", "F", "0", "\"false\""] {
        assert!(
            eval(&format!("Service.EnableTagOverride == {v}"), &row),
            "{v}"
        );
    }
    for v in ["true", "True", "t", "1"] {
        assert!(
            eval(&format!("Service.EnableTagOverride != {v}"), &row),
            "{v}"
        );
    }
    let err = parse("Service.EnableTagOverride == yes")
        .evaluate(&row)
        .unwrap_err();
    assert!(err.to_string().contains("is not a boolean"), "{err}");
}

#[test]
fn in_and_contains_on_lists_maps_and_strings() {
    let row = health_row();
    // List membership.
    assert!(eval("canary in Service.Tags", &row));
    assert!(eval(r#""canary" in Service.Tags"#, &row));
    assert!(eval("Service.Tags contains v1", &row));
    assert!(!eval("v2 in Service.Tags", &row));
    assert!(eval("v2 not in Service.Tags", &row));
    assert!(eval("Service.Tags not contains v2", &row));
    // Membership is whole-element, not substring.
    assert!(!eval("can in Service.Tags", &row));
    // Map keys.
    assert!(eval("version in Service.Meta", &row));
    assert!(eval(r#""rack id" in Node.Meta"#, &row));
    assert!(!eval("v1 in Service.Meta", &row)); // values are not keys
    assert!(eval("lan in Node.TaggedAddresses", &row));
    assert!(eval("Node.TaggedAddresses not contains foo", &row));
    // Substring of a string.
    assert!(eval("Service.Service contains we", &row));
    assert!(eval("eb in Service.Service", &row));
    assert!(eval("Node.Address contains `10.1.`", &row));
    assert!(!eval("xyz in Service.Service", &row));
    assert!(eval(r#""" in Service.Service"#, &row));
    // Numbers in a list compare as numbers.
    let nums = json!({"Ports": [80, 443], "Mixed": ["a", 1, true]});
    assert!(eval("443 in Ports", &nums));
    assert!(eval(r#""0x50" in Ports"#, &nums));
    assert!(!eval("8080 in Ports", &nums));
    assert!(!eval("abc in Ports", &nums)); // unconvertible elements just do not match
    assert!(eval("a in Mixed", &nums));
    assert!(eval("1 in Mixed", &nums));
    assert!(eval("true in Mixed", &nums));
    // `in` on a number is an error.
    assert!(parse("1 in Service.Port").evaluate(&row).is_err());
}

#[test]
fn emptiness() {
    let row = health_row();
    assert!(eval("Service.Address is empty", &row));
    assert!(eval("Service.Service is not empty", &row));
    assert!(eval("Service.Tags is not empty", &row));
    assert!(eval("Service.Meta is not empty", &row));
    let empty = json!({"Tags": [], "Meta": {}, "S": ""});
    assert!(eval("Tags is empty", &empty));
    assert!(eval("Meta is empty", &empty));
    assert!(eval("S is empty", &empty));
    assert!(!eval("Tags is not empty", &empty));
    // Length of a number is meaningless.
    assert!(parse("Service.Port is empty").evaluate(&row).is_err());
}

#[test]
fn regex_matching() {
    let row = health_row();
    assert!(eval("Service.Service matches `^w.b$`", &row));
    assert!(eval(r#"Service.Service matches "e""#, &row)); // unanchored
    assert!(!eval("Service.Service matches `^eb`", &row));
    assert!(eval("Service.Service not matches `^api`", &row));
    assert!(eval(r#"Node.Address matches "^10\\.1\\.""#, &row));
    assert!(eval(r#"Node.Meta["rack id"] matches `r[0-9]+`"#, &row));
    // Regex against a number is an error (and no match).
    let f = parse("Service.Port matches `80`");
    assert!(f.evaluate(&row).is_err());
    assert!(!f.matches(&row));
}

#[test]
fn missing_map_keys_use_bexpr_dispositions() {
    let row = health_row();
    let cases = [
        ("Service.Meta.nope == x", false),
        ("Service.Meta.nope != x", true),
        ("x in Service.Meta.nope", false),
        ("x not in Service.Meta.nope", true),
        ("Service.Meta.nope is empty", true),
        ("Service.Meta.nope is not empty", false),
        ("Service.Meta.nope matches `.*`", false),
        ("Service.Meta.nope not matches `.*`", true),
    ];
    for (expr, want) in cases {
        assert_eq!(eval(expr, &row), want, "{expr}");
        // Same answers with the schema bound (map keys stay "not present"),
        // except that Consul refuses emptiness tests on string fields.
        if expr.contains("empty") {
            assert!(Filter::parse_for(expr, &schemas::HEALTH_SERVICE).is_err());
        } else {
            assert_eq!(eval_health(expr, &row), want, "{expr} (schema)");
        }
    }
    // Deeper than the missing key too.
    assert!(eval(r#"Node.Meta["a"] != x"#, &row));
}

#[test]
fn selecting_through_a_list_matches_if_any_element_matches() {
    // go-bexpr (the reflection evaluator Consul uses) applies the rest of the
    // selector to every list element and returns true on the first match.
    let row = health_row();
    assert!(eval("Checks.Status == passing", &row));
    assert!(eval("Checks.Status == critical", &row));
    assert!(!eval("Checks.Status == warning", &row));
    // `!=` is also "any": true because one check is not passing...
    assert!(eval("Checks.Status != passing", &row));
    // ...which differs from `not (... == ...)`, i.e. "no check is passing".
    assert!(!eval("not Checks.Status == passing", &row));
    assert!(eval("Checks.CheckID matches `^service:`", &row));
    assert!(eval(r#"Checks.ServiceID == "web-1""#, &row));
    // A missing field in one element is "not present" for that element only.
    assert!(eval(
        r#"Checks.ServiceID == """#,
        &json!({"Checks": [{"ServiceID": ""}]})
    ));
    // Lists inside list elements.
    assert!(eval("v1 in Checks.ServiceTags", &row));
    assert!(eval("Checks.ServiceTags is empty", &row)); // serfHealth's list
    assert!(eval("Checks.ServiceTags is not empty", &row));
    assert!(!eval("v9 in Checks.ServiceTags", &row));
    // Nested structs in lists.
    assert!(eval("Service.Proxy.Upstreams.DestinationName == db", &row));
    assert!(eval("Service.Proxy.Upstreams.LocalBindPort == 9292", &row));
    assert!(!eval(
        "Service.Proxy.Upstreams.DestinationName == api",
        &row
    ));

    let all_passing = json!({"Checks": [{"Status": "passing"}, {"Status": "passing"}]});
    assert!(!eval("Checks.Status != passing", &all_passing));
    assert!(eval("not Checks.Status != passing", &all_passing));
}

#[test]
fn an_empty_list_fails_every_test_through_it() {
    let row = json!({"Checks": []});
    for expr in [
        "Checks.Status == passing",
        "Checks.Status != passing",
        "Checks.Status is empty",
        "Checks.Status not matches x",
        "x not in Checks.Status",
    ] {
        assert!(!eval(expr, &row), "{expr}");
    }
    assert!(eval("Checks is empty", &row));
}

#[test]
fn null_and_missing_values_without_a_schema() {
    let row = json!({"Meta": null, "Tags": null, "Checks": null});
    assert!(eval("Meta is empty", &row));
    assert!(!eval("x in Meta", &row));
    assert!(eval("x not in Tags", &row));
    assert!(!eval("Meta.k == v", &row));
    // Without a schema, null/missing is "not present" all the way down.
    assert!(eval("Checks.Status != passing", &row));
    assert!(eval("Nope.Deeper != x", &row));
    assert!(!eval("Nope == x", &row));
    assert!(eval("Nope is empty", &row));
}

#[test]
fn nested_selection_on_a_scalar_is_an_error() {
    let row = health_row();
    let err = parse("Service.Port.x == 1").evaluate(&row).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"Value at selector "Service.Port" with type number does not support nested field selection"#
    );
    assert!(!parse("Service.Port.x == 1").matches(&row));
    assert!(parse("Service.Tags == x").evaluate(&row).is_err());
}

#[test]
fn boolean_connectives_short_circuit_and_propagate_errors() {
    let row = health_row();
    // The erroring right side is never reached.
    assert!(eval("Service.Service == web or Service.Port.x == 1", &row));
    assert!(!eval(
        "Service.Service == api and Service.Port.x == 1",
        &row
    ));
    assert!(
        parse("Service.Service == api or Service.Port.x == 1")
            .evaluate(&row)
            .is_err()
    );
    assert!(parse("not Service.Port.x == 1").evaluate(&row).is_err());
}

// ---------------------------------------------------------------- schemas

#[test]
fn documented_selectors_validate() {
    // Selector tables from Consul's API docs (health.mdx, catalog.mdx).
    let health = [
        "Checks",
        "Checks.CheckID",
        "Checks.Name",
        "Checks.Node",
        "Checks.Notes",
        "Checks.Output",
        "Checks.ServiceID",
        "Checks.ServiceName",
        "Checks.ServiceTags",
        "Checks.Status",
        "Node.Address",
        "Node.Datacenter",
        "Node.ID",
        "Node.Meta",
        "Node.Meta.<any>",
        "Node.Node",
        "Node.TaggedAddresses",
        "Node.TaggedAddresses.<any>",
        "Service.Address",
        "Service.Connect.Native",
        "Service.EnableTagOverride",
        "Service.ID",
        "Service.Kind",
        "Service.Meta",
        "Service.Meta.<any>",
        "Service.Port",
        "Service.Proxy.DestinationServiceID",
        "Service.Proxy.DestinationServiceName",
        "Service.Proxy.LocalServiceAddress",
        "Service.Proxy.LocalServicePort",
        "Service.Proxy.Mode",
        "Service.Proxy.TransparentProxy.OutboundListenerPort",
        "Service.Proxy.MeshGateway.Mode",
        "Service.Proxy.Upstreams",
        "Service.Proxy.Upstreams.Datacenter",
        "Service.Proxy.Upstreams.DestinationName",
        "Service.Proxy.Upstreams.DestinationNamespace",
        "Service.Proxy.Upstreams.DestinationType",
        "Service.Proxy.Upstreams.LocalBindAddress",
        "Service.Proxy.Upstreams.LocalBindPort",
        "Service.Proxy.Upstreams.MeshGateway.Mode",
        "Service.Service",
        "Service.TaggedAddresses",
        "Service.TaggedAddresses.<any>.Address",
        "Service.TaggedAddresses.<any>.Port",
        "Service.Tags",
        "Service.Weights.Passing",
        "Service.Weights.Warning",
    ];
    let listed: Vec<String> = schemas::HEALTH_SERVICE
        .selectors()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    for sel in health {
        assert!(listed.iter().any(|l| l == sel), "missing {sel}");
    }
    let catalog = [
        "Address",
        "Datacenter",
        "ID",
        "Node",
        "NodeMeta.<any>",
        "NodeMeta",
        "ServiceAddress",
        "ServiceConnect.Native",
        "ServiceEnableTagOverride",
        "ServiceID",
        "ServiceKind",
        "ServiceMeta.<any>",
        "ServiceMeta",
        "ServiceName",
        "ServicePort",
        "ServiceProxy.DestinationServiceID",
        "ServiceProxy.Upstreams.LocalBindPort",
        "ServiceProxy.Upstreams",
        "ServiceTaggedAddresses.<any>.Address",
        "ServiceTaggedAddresses.<any>.Port",
        "ServiceTaggedAddresses",
        "ServiceTags",
        "ServiceWeights.Passing",
        "ServiceWeights.Warning",
        "TaggedAddresses.<any>",
        "TaggedAddresses",
    ];
    let listed: Vec<String> = schemas::CATALOG_SERVICE
        .selectors()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    for sel in catalog {
        assert!(listed.iter().any(|l| l == sel), "missing {sel}");
    }
    let nodes: Vec<String> = schemas::CATALOG_NODES
        .selectors()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    for sel in [
        "ID",
        "Node",
        "Address",
        "Datacenter",
        "TaggedAddresses",
        "TaggedAddresses.<any>",
        "Meta",
        "Meta.<any>",
    ] {
        assert!(nodes.iter().any(|l| l == sel), "missing {sel}");
    }
    let checks: Vec<String> = schemas::HEALTH_CHECKS
        .selectors()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    for sel in [
        "CheckID",
        "Name",
        "Node",
        "Notes",
        "Output",
        "ServiceID",
        "ServiceName",
        "ServiceTags",
        "Status",
        "Type",
    ] {
        assert!(checks.iter().any(|l| l == sel), "missing {sel}");
    }
    let services: Vec<String> = schemas::CATALOG_NODE_SERVICES
        .selectors()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    for sel in [
        "Kind",
        "ID",
        "Service",
        "Tags",
        "Meta",
        "Meta.<any>",
        "Port",
        "Address",
        "Weights.Passing",
        "Proxy.DestinationServiceName",
        "Connect.Native",
    ] {
        assert!(services.iter().any(|l| l == sel), "missing {sel}");
    }
}

#[test]
fn selector_operator_table_matches_consul_docs() {
    use MatchOp::*;
    let ops = |schema: &Schema, sel: &str| -> Vec<MatchOp> {
        schema
            .selectors()
            .into_iter()
            .find(|(p, _)| p == sel)
            .unwrap_or_else(|| panic!("no selector {sel}"))
            .1
    };
    let string_ops = vec![Equal, NotEqual, In, NotIn, Matches, NotMatches];
    let h = &schemas::HEALTH_SERVICE;
    assert_eq!(ops(h, "Checks"), vec![IsEmpty, IsNotEmpty]);
    assert_eq!(ops(h, "Checks.Status"), string_ops);
    assert_eq!(
        ops(h, "Checks.ServiceTags"),
        vec![In, NotIn, IsEmpty, IsNotEmpty]
    );
    assert_eq!(ops(h, "Node.Meta"), vec![In, NotIn, IsEmpty, IsNotEmpty]);
    assert_eq!(ops(h, "Node.Meta.<any>"), string_ops);
    assert_eq!(ops(h, "Service.Port"), vec![Equal, NotEqual]);
    assert_eq!(ops(h, "Service.Connect.Native"), vec![Equal, NotEqual]);
    assert_eq!(ops(h, "Service.Proxy.Upstreams"), vec![IsEmpty, IsNotEmpty]);
    assert_eq!(
        ops(h, "Service.TaggedAddresses.<any>.Port"),
        vec![Equal, NotEqual]
    );
    // Structs themselves and opaque maps' values are not listed.
    let all: Vec<String> = h.selectors().into_iter().map(|(p, _)| p).collect();
    assert!(
        !all.iter()
            .any(|p| p == "Node" || p == "Service" || p == "Service.Proxy")
    );
    assert!(all.iter().any(|p| p == "Service.Proxy.Config"));
    assert!(!all.iter().any(|p| p.starts_with("Service.Proxy.Config.")));
}

#[test]
fn unknown_selectors_are_rejected_with_consul_message() {
    let h = &schemas::HEALTH_SERVICE;
    assert_eq!(
        validate_err("Foo == 1", h),
        r#"Selector "Foo" is not valid"#
    );
    assert_eq!(
        validate_err("Service.Foo.Bar == 1", h),
        r#"Selector "Service.Foo" is not valid"#
    );
    assert_eq!(
        validate_err("Checks.Foo == 1", h),
        r#"Selector "Checks.Foo" is not valid"#
    );
    assert_eq!(
        validate_err("Service.Tags.x == 1", h),
        r#"Selector "Service.Tags.x" is not valid"#
    );
    assert_eq!(
        validate_err("Service.Proxy.Config.x == 1", h),
        r#"Selector "Service.Proxy.Config.x" is not valid"#
    );
    assert_eq!(
        validate_err("Service.Port.x == 1", h),
        r#"Selector "Service.Port.x" is not valid"#
    );
    // Field names are case-sensitive, as in bexpr.
    assert_eq!(
        validate_err("service.Port == 1", h),
        r#"Selector "service" is not valid"#
    );
    // RaftIndex is hidden from bexpr in Consul (`bexpr:"-"`).
    let c = &schemas::CATALOG_SERVICE;
    assert_eq!(
        validate_err("CreateIndex == 1", c),
        r#"Selector "CreateIndex" is not valid"#
    );
    assert_eq!(
        validate_err("ModifyIndex == 1", c),
        r#"Selector "ModifyIndex" is not valid"#
    );
    // The first invalid selector in the expression is reported.
    assert_eq!(
        validate_err("ServiceName == web and (Bad1 == 1 or Bad2 == 2)", c),
        r#"Selector "Bad1" is not valid"#
    );
    assert_eq!(
        validate_err("not Nope is empty", c),
        r#"Selector "Nope" is not valid"#
    );
    // Any key under a map is fine, including quoted keys.
    parse(r#"NodeMeta["any key at all"] == x and ServiceMeta.v == y"#)
        .validate(c)
        .unwrap();
}

#[test]
fn operators_are_checked_against_field_types() {
    let c = &schemas::CATALOG_SERVICE;
    assert_eq!(
        validate_err("ServicePort matches `80`", c),
        r#"Invalid match operator "Matches" for selector "ServicePort""#
    );
    assert_eq!(
        validate_err("ServiceTags == prod", c),
        r#"Invalid match operator "Equal" for selector "ServiceTags""#
    );
    assert_eq!(
        validate_err("ServiceAddress is empty", c),
        r#"Invalid match operator "Is Empty" for selector "ServiceAddress""#
    );
    assert_eq!(
        validate_err("ServiceMeta == x", c),
        r#"Invalid match operator "Equal" for selector "ServiceMeta""#
    );
    assert_eq!(
        validate_err("ServiceProxy is empty", c),
        r#"Invalid match operator "Is Empty" for selector "ServiceProxy""#
    );
    assert_eq!(
        validate_err("ServiceProxy.Upstreams contains db", c),
        r#"Invalid match operator "In" for selector "ServiceProxy.Upstreams""#
    );
    assert_eq!(
        validate_err("x in ServicePort", c),
        r#"Invalid match operator "In" for selector "ServicePort""#
    );
    assert_eq!(
        validate_err("ServiceEnableTagOverride not matches x", c),
        r#"Invalid match operator "Not Matches" for selector "ServiceEnableTagOverride""#
    );
    for ok in [
        "ServiceTags contains prod",
        "ServiceTags is not empty",
        "ServiceMeta is empty",
        "version in ServiceMeta",
        "ServiceName matches `^w`",
        "web in ServiceName",
        "ServicePort != 1",
        "ServiceProxy.Upstreams is empty",
        "ServiceProxy.Config is empty",
        "ServiceTaggedAddresses.wan.Port == 512",
    ] {
        parse(ok)
            .validate(c)
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn values_are_coerced_at_validation() {
    let c = &schemas::CATALOG_SERVICE;
    assert_eq!(
        validate_err("ServicePort == abc", c),
        r#"Failed to coerce value "abc" for selector "ServicePort": "abc" is not an integer"#
    );
    assert_eq!(
        validate_err("ServicePort == 1.5", c),
        r#"Failed to coerce value "1.5" for selector "ServicePort": "1.5" is not an integer"#
    );
    assert_eq!(
        validate_err("ServicePort == 99999999999999999999", c),
        r#"Failed to coerce value "99999999999999999999" for selector "ServicePort": "99999999999999999999" is out of range"#
    );
    assert_eq!(
        validate_err("ServiceEnableTagOverride == yes", c),
        r#"Failed to coerce value "yes" for selector "ServiceEnableTagOverride": "yes" is not a boolean"#
    );
    parse("ServicePort == \"80\" and ServiceEnableTagOverride == T and ServicePort != `0x50`")
        .validate(c)
        .unwrap();
    let checks = &schemas::HEALTH_CHECKS;
    parse("Definition.OutputMaxSize == 4096")
        .validate(checks)
        .unwrap();
    assert!(
        validate_err("Definition.OutputMaxSize == -1", checks)
            .contains("is not an unsigned integer")
    );
}

#[test]
fn schema_bound_evaluation_uses_go_zero_values() {
    // In Consul the Go struct always has every field; a row serialised with
    // omitted/null fields must behave like the zero value.
    let row = json!({
        "Node": {"Node": "n1"},
        "Service": {"Service": "web", "Tags": null, "Weights": null, "Port": 0},
        "Checks": null
    });
    assert!(eval_health("Service.Tags is empty", &row));
    assert!(eval_health(
        r#"Service.Proxy.DestinationServiceName == """#,
        &row
    ));
    assert!(eval_health("Service.Proxy.Upstreams is empty", &row));
    assert!(eval_health("Service.Weights.Passing == 0", &row));
    assert!(eval_health("Service.EnableTagOverride == false", &row));
    assert!(eval_health("Service.Meta is empty", &row));
    assert!(eval_health("Node.Meta is empty", &row));
    assert!(!eval_health("x in Node.Meta", &row));
    assert!(eval_health(r#"Service.Address == """#, &row));
    // Null list: "any element" over nothing is false, even for `!=`; without
    // the schema the same row answers with the not-present disposition.
    assert!(!eval_health("Checks.Status != passing", &row));
    assert!(eval("Checks.Status != passing", &row));
    assert!(eval_health("Checks is empty", &row));
}

#[test]
fn schema_bound_struct_fields_fall_back_to_case_insensitive_keys() {
    // The docs show service tagged addresses as {"address":..,"port":..}.
    let row = json!({
        "Node": {}, "Checks": [],
        "Service": {"TaggedAddresses": {"wan": {"address": "198.18.0.1", "port": 80}}}
    });
    assert!(eval_health(
        "Service.TaggedAddresses.wan.Address == `198.18.0.1`",
        &row
    ));
    assert!(eval_health("Service.TaggedAddresses.wan.Port == 80", &row));
    // Map keys stay exact.
    assert!(!eval_health("Service.TaggedAddresses.WAN.Port == 80", &row));
}

#[test]
fn catalog_service_rows() {
    let row = catalog_row();
    let eval_c = |s: &str| {
        Filter::parse_for(s, &schemas::CATALOG_SERVICE)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .evaluate(&row)
            .unwrap()
    };
    assert!(eval_c(
        "ServiceName == web and ServiceTags contains primary"
    ));
    assert!(eval_c("ServiceMeta.version == v2"));
    assert!(eval_c("NodeMeta is empty"));
    assert!(eval_c(
        "ServicePort == 5000 and ServiceEnableTagOverride == true"
    ));
    assert!(eval_c("ServiceTaggedAddresses.wan.Port == 512"));
    assert!(eval_c("ServiceProxy.Upstreams is empty"));
    assert!(!eval_c("ServiceProxy.Upstreams.DestinationName != x"));
    assert!(eval_c("ServiceProxy.Config is empty"));
    assert!(eval_c("Node matches `^t2\\.`"));
    assert!(eval_c("ServiceKind == \"\""));
}

#[test]
fn resolver_subset_filters() {
    // Discovery-chain subsets are evaluated against health/service rows.
    let row = health_row();
    assert!(eval_health("Service.Meta.version == v1", &row));
    assert!(!eval_health("Service.Meta.version == v2", &row));
    assert!(eval_health(r#""canary" in Service.Tags"#, &row));
    assert!(eval_health("Service.Meta.version != v2", &row));
    assert!(!eval_health("Service.Meta.missing == v1", &row));
    // The config-entry validator only needs parse + validate.
    assert!(Filter::parse("Service.Meta.version ==").is_err());
    assert!(Filter::parse_for("Service.Meta.version == v1", &schemas::HEALTH_SERVICE).is_ok());
    assert!(Filter::parse_for("Service.Version == v1", &schemas::HEALTH_SERVICE).is_err());
}

#[test]
fn health_checks_and_nodes_rows() {
    let check = json!({"Node": "n1", "CheckID": "serfHealth", "Name": "Serf Health Status",
        "Status": "passing", "ServiceTags": [], "Type": "", "ExposedPort": 0});
    let f = Filter::parse_for(
        "Status == passing and CheckID == serfHealth",
        &schemas::HEALTH_CHECKS,
    )
    .unwrap();
    assert!(f.matches(&check));
    let f = Filter::parse_for(
        "ServiceTags is empty and Name contains Serf",
        &schemas::HEALTH_CHECKS,
    )
    .unwrap();
    assert!(f.matches(&check));

    let node = json!({"ID": "x", "Node": "n1", "Address": "10.0.0.1", "Datacenter": "dc1",
        "TaggedAddresses": {"lan": "10.0.0.1"}, "Meta": {"env": "prod"}});
    let f = Filter::parse_for(
        "Meta.env == prod and lan in TaggedAddresses",
        &schemas::CATALOG_NODES,
    )
    .unwrap();
    assert!(f.matches(&node));

    let svc = json!({"Kind": "connect-proxy", "ID": "web-sidecar", "Service": "web-sidecar-proxy",
        "Tags": [], "Meta": {}, "Port": 21000, "Address": "",
        "Proxy": {"DestinationServiceName": "web", "Upstreams": []}});
    let f = Filter::parse_for(
        "Kind == `connect-proxy` and Proxy.DestinationServiceName == web and Port == 21000",
        &schemas::AGENT_SERVICES,
    )
    .unwrap();
    assert!(f.matches(&svc));
}

// ---------------------------------------------------------------- fuzz

/// Small deterministic PRNG (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Runs every entry point on `input`; any panic fails the test.
fn exercise(input: &str, rows: &[Value]) {
    let Ok(f) = Filter::parse(input) else { return };
    // Canonical rendering must parse back to the same rendering.
    let once = f.expr().to_string();
    let again = Filter::parse(&once)
        .unwrap_or_else(|e| panic!("rendering of {input:?} did not reparse: {once:?}: {e}"));
    assert_eq!(once, again.expr().to_string(), "input {input:?}");
    for schema in [
        &schemas::HEALTH_SERVICE,
        &schemas::CATALOG_SERVICE,
        &schemas::HEALTH_CHECKS,
    ] {
        let _ = f.validate(schema);
    }
    let bound = Filter::parse_for(input, &schemas::HEALTH_SERVICE).ok();
    for row in rows {
        let _ = f.evaluate(row);
        let _ = f.matches(row);
        if let Some(b) = &bound {
            // Validated against the schema and evaluated against a row of
            // that shape: evaluation must not error.
            if row
                .get("Checks")
                .is_some_and(|c| c[0].get("Status").is_some())
            {
                b.evaluate(row)
                    .unwrap_or_else(|e| panic!("validated {input:?} failed to evaluate: {e}"));
            }
        }
    }
}

#[test]
fn fuzz_token_soup_never_panics() {
    const PIECES: &[&str] = &[
        "Service",
        "Service.Meta",
        "Service.Tags",
        "Checks.Status",
        "Node.Meta[\"k y\"]",
        "Service.Port",
        "Checks",
        "Service.Proxy.Upstreams.DestinationName",
        "x",
        "v1.2",
        "==",
        "!=",
        "in",
        "not",
        "contains",
        "matches",
        "is",
        "empty",
        "and",
        "or",
        "(",
        ")",
        "\"",
        "`",
        "\"str\"",
        "`raw`",
        "\"\\n\"",
        "\"\\u00e9\"",
        "\"\\x\"",
        "5",
        "-3",
        "1.5",
        "0x10",
        "[",
        "]",
        ".",
        "\"(\"",
        "`^w`",
        "passing",
        "true",
        "é",
        "\\",
        "'",
        "=",
        "!",
        "\n",
        "\t",
        "",
        "not in",
        "is not empty",
    ];
    let rows = [
        health_row(),
        catalog_row(),
        json!(null),
        json!([]),
        json!({"Checks": [1, null, "x"]}),
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..20_000 {
        let n = 1 + rng.below(10);
        let mut s = String::new();
        for _ in 0..n {
            s.push_str(PIECES[rng.below(PIECES.len())]);
            if rng.below(4) != 0 {
                s.push(' ');
            }
        }
        exercise(&s, &rows);
    }
}

#[test]
fn fuzz_random_characters_never_panic() {
    const CHARS: &[char] = &[
        'a', 'Z', '0', '9', '_', '.', '[', ']', '(', ')', '"', '`', '\\', '=', '!', '-', ' ', '\n',
        '\r', '\t', 'é', '😀', '\u{0}', 'x', 'u', 'U', '7', 'n', 'o', 't', 'i', 's',
    ];
    let rows = [health_row(), json!({})];
    let mut rng = Rng(42);
    for _ in 0..20_000 {
        let n = rng.below(24);
        let s: String = (0..n).map(|_| CHARS[rng.below(CHARS.len())]).collect();
        exercise(&s, &rows);
    }
    // A few valid expressions generated structurally must always parse.
    let sels = [
        "Service.Service",
        "Node.Node",
        "Checks.Status",
        r#"Service.Meta["a b"]"#,
    ];
    let vals = ["web", "`x y`", "\"q\\\"\"", "5"];
    for i in 0..200 {
        let s = format!(
            "{} == {} {} not {} is empty",
            sels[i % 4],
            vals[(i / 4) % 4],
            if i % 2 == 0 { "and" } else { "or" },
            sels[(i / 16) % 4]
        );
        exercise(&s, &[health_row()]);
        assert!(Filter::parse(&s).is_ok(), "{s}");
    }
}

// ------------------------------------------------- what a filter may cost

/// Hostile regexes are refused before they cost much: one filter may
/// compile at most `MAX_REGEXES`, each within `REGEX_SIZE` (an anonymous
/// 40 × `\w{190}` once took 2.5 s and 388 MB).
#[test]
fn a_filters_regexes_are_bounded_in_number_and_size() {
    let clause = |i: usize| format!("Node matches \"n{i}.*\"");
    let most: Vec<String> = (0..parser::MAX_REGEXES).map(clause).collect();
    parse(&most.join(" or "));
    let over: Vec<String> = (0..=parser::MAX_REGEXES).map(clause).collect();
    let e = parse_err(&over.join(" or "));
    assert!(e.contains("more than 16 \"matches\""), "{e}");

    let e = parse_err(r#"Node matches "\\w{190}""#);
    assert!(e.contains("size limit"), "{e}");
    // Ordinary patterns stay well within it.
    parse(r#"Node matches "^web-[0-9]+\\.example\\.com$""#);
}
