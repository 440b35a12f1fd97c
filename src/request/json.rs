//! Request bodies decoded as Consul decodes them: Go's `encoding/json`
//! matches a key to a struct field in any letter case, so clients send
//! `"enabletagoverride"`, `"lockdelay"` or `"node"` and Consul takes them.
//!
//! `from_value` does the same for any serde type, at every depth: a
//! deserializer over `serde_json::Value` that, when a struct asks for its
//! fields, renames each key that names none of them exactly but one of
//! them in another case (an exact name, or a serde alias such as a
//! snake_case one, always wins). Everything else is serde_json's own.

use serde::de::value::StringDeserializer;
use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, SeqAccess};
use serde::de::{Error as _, Unexpected, Visitor};
use serde_json::{Map, Value};

/// `T` from `v`, struct fields matched in any letter case.
pub fn from_value<T: DeserializeOwned>(v: Value) -> Result<T, serde_json::Error> {
    T::deserialize(AnyCase(v))
}

struct AnyCase(Value);

/// Keys that name a field in another case take its exact name (unless the
/// body has that one too).
fn fold(mut map: Map<String, Value>, fields: &[&str]) -> Map<String, Value> {
    let renames: Vec<(String, &str)> = map
        .keys()
        .filter(|k| !fields.contains(&k.as_str()))
        .filter_map(|k| {
            let f = fields
                .iter()
                .find(|f| f.eq_ignore_ascii_case(k) && !map.contains_key(**f))?;
            Some((k.clone(), *f))
        })
        .collect();
    for (from, to) in renames {
        if let Some(v) = map.remove(&from) {
            map.insert(to.to_string(), v);
        }
    }
    map
}

fn unexpected(v: &Value) -> Unexpected<'_> {
    match v {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(_) => Unexpected::Other("number"),
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

macro_rules! forward {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.0.$method(visitor)
        }
    )*};
}

impl<'de> Deserializer<'de> for AnyCase {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Array(items) => visitor.visit_seq(Items(items.into_iter())),
            Value::Object(map) => visitor.visit_map(Entries::new(map)),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self, _name: &'static str, fields: &'static [&'static str], visitor: V,
    ) -> Result<V::Value, Self::Error> {
        // An object only: serde would take an array as the fields in
        // order, which Go's decoder (and so Consul) never does.
        match self.0 {
            Value::Object(map) => visitor.visit_map(Entries::new(fold(map, fields))),
            other => Err(serde_json::Error::invalid_type(
                unexpected(&other),
                &visitor,
            )),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            v => visitor.visit_some(AnyCase(v)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self, _name: &'static str, visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self, name: &'static str, variants: &'static [&'static str], visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self, name: &'static str, visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self, _len: usize, visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self, _name: &'static str, _len: usize, visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    forward! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_f32
        deserialize_f64 deserialize_char deserialize_str deserialize_string deserialize_bytes
        deserialize_byte_buf deserialize_unit deserialize_identifier
    }
}

struct Items(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for Items {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self, seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(AnyCase(v)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Entries {
    iter: serde_json::map::IntoIter,
    value: Option<Value>,
}

impl Entries {
    fn new(map: Map<String, Value>) -> Self {
        Entries {
            iter: map.into_iter(),
            value: None,
        }
    }
}

impl<'de> MapAccess<'de> for Entries {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self, seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((k, v)) = self.iter.next() else {
            return Ok(None);
        };
        self.value = Some(v);
        seed.deserialize(StringDeserializer::<serde_json::Error>::new(k))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self, seed: V,
    ) -> Result<V::Value, Self::Error> {
        let v = self
            .value
            .take()
            .ok_or_else(|| serde_json::Error::custom("a value without its key"))?;
        seed.deserialize(AnyCase(v))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "PascalCase", default, deny_unknown_fields)]
    struct Inner {
        #[serde(rename = "ServiceID", alias = "service_id")]
        service_id: String,
        lock_delay: Option<u64>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "PascalCase", default)]
    struct Outer {
        enable_tag_override: bool,
        tags: Vec<String>,
        inner: Option<Inner>,
        list: Vec<Inner>,
        meta: std::collections::BTreeMap<String, String>,
    }

    #[test]
    fn keys_match_fields_in_any_case_at_every_depth() {
        let v = json!({
            "enabletagoverride": true, "TAGS": ["a"],
            "inner": {"serviceid": "s1", "lockdelay": 5},
            "List": [{"service_id": "s2"}],
            "Meta": {"lowercase": "kept", "Other": "kept too"},
        });
        let o: Outer = from_value(v).unwrap();
        assert_eq!(
            o,
            Outer {
                enable_tag_override: true,
                tags: vec!["a".into()],
                inner: Some(Inner {
                    service_id: "s1".into(),
                    lock_delay: Some(5),
                }),
                list: vec![Inner {
                    service_id: "s2".into(),
                    lock_delay: None,
                }],
                meta: [("lowercase", "kept"), ("Other", "kept too")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
            }
        );
    }

    #[test]
    fn an_exact_key_wins_and_bad_bodies_are_still_refused() {
        let o: Outer = from_value(json!({"Tags": ["exact"], "tags": ["other"]})).unwrap();
        assert_eq!(o.tags, ["exact"]);
        let e = from_value::<Inner>(json!({"Bogus": 1})).unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let e = from_value::<Outer>(json!({"Tags": "not a list"})).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
        let e = from_value::<Inner>(json!(["s1", 5])).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
    }
}
