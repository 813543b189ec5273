//! Request JSON without ambiguity: an object that names a key twice, at any depth, is refused
//! (serde_json alone keeps the last one, so `{"estimate":…1…,"estimate":…999999…}` would
//! reserve 999999 while a log or a proxy that reads the first sees 1).

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A flat JSON object of string fields, written directly: a value that needs no escaping (the
/// ids and names of a request context, nearly always) is copied whole, and only one that does
/// goes through serde_json's escaper (which reads every byte of every key and value on its own).
pub fn string_object(fields: &[(&str, &str)]) -> String {
    let size: usize = fields.iter().map(|(k, v)| k.len() + v.len() + 6).sum();
    let mut out = String::with_capacity(size + 2);
    out.push('{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_string(&mut out, key);
        out.push(':');
        push_string(&mut out, value);
    }
    out.push('}');
    out
}

fn push_string(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).expect("strings serialize"));
    }
}

/// Where the parser is: the keys (and array positions) from the root to the current value.
enum Step {
    Key(String),
    Item,
}

/// Parses `bytes` as one JSON value. The error names the duplicated key by its path
/// (`subject.agent`, `metadata.items[].id`).
pub fn parse(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let path = RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict { path: &path }.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

fn describe(path: &[Step], key: &str) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Item => out.push_str("[]"),
        }
    }
    if !out.is_empty() {
        out.push('.');
    }
    out.push_str(key);
    out
}

#[derive(Clone, Copy)]
struct Strict<'a> {
    path: &'a RefCell<Vec<Step>>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        self.path.borrow_mut().push(Step::Item);
        while let Some(v) = seq.next_element_seed(self)? {
            items.push(v);
        }
        self.path.borrow_mut().pop();
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            // The key rides on the path while its value is read, then comes back for the insert
            // (one search of the map finds a duplicate and the place for a new key).
            self.path.borrow_mut().push(Step::Key(key));
            let value = map.next_value_seed(self)?;
            let Some(Step::Key(key)) = self.path.borrow_mut().pop() else { unreachable!("pushed above") };
            match out.entry(key) {
                serde_json::map::Entry::Vacant(slot) => {
                    slot.insert(value);
                }
                serde_json::map::Entry::Occupied(taken) => {
                    let field = describe(&self.path.borrow(), taken.key());
                    return Err(de::Error::custom(format!("duplicate field `{field}`")));
                }
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written directly, a string object is the JSON serde_json writes, byte for byte, whether
    /// its values need escaping or not.
    #[test]
    fn string_objects_are_what_serde_json_writes() {
        #[derive(serde::Serialize)]
        struct Two<'a> {
            a: &'a str,
            b: &'a str,
        }
        for (a, b) in [("req-1", ""), ("q\"uote", "back\\slash"), ("line\nbreak\u{1}", "é ünï \u{7f}")] {
            assert_eq!(string_object(&[("a", a), ("b", b)]), serde_json::to_string(&Two { a, b }).unwrap());
        }
        assert_eq!(string_object(&[]), "{}");
    }

    #[test]
    fn duplicates_are_refused_at_any_depth_and_named() {
        let e = parse(br#"{"estimate":{"amount":1},"estimate":{"amount":999999}}"#).unwrap_err();
        assert!(e.to_string().starts_with("duplicate field `estimate`"), "{e}");
        let e = parse(br#"{"subject":{"tenant":"a","agent":"x","agent":"y"}}"#).unwrap_err();
        assert!(e.to_string().starts_with("duplicate field `subject.agent`"), "{e}");
        let e = parse(br#"{"m":{"items":[{"id":1},{"id":2,"id":3}]}}"#).unwrap_err();
        assert!(e.to_string().starts_with("duplicate field `m.items[].id`"), "{e}");
        // the same key in sibling objects is fine
        assert!(parse(br#"{"a":{"k":1},"b":{"k":2},"c":[{"k":1},{"k":2}]}"#).is_ok());
    }

    #[test]
    fn values_are_those_serde_json_reads() {
        let text = br#"{"a":[1,-2,3.5,"s",true,null,{"b":{}}],"big":18446744073709551615,"neg":-9223372036854775808}"#;
        assert_eq!(parse(text).unwrap(), serde_json::from_slice::<Value>(text).unwrap());
        assert!(parse(b"{} x").is_err());
        assert!(parse(b"{\"a\":1,}").is_err());
    }
}
