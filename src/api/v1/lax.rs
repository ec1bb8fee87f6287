//! The lenient field reading of `/v1` bodies, as the reference server does it: unknown fields
//! refused, and the coercions its clients rely on (numeric strings for numbers, `"yes"`/`0`/`1`
//! for booleans, `64.0` for an integer). Every refusal is a 422 `validation_error` naming the
//! field; range rules that depend on the server's settings are the handlers' business (400).

use serde_json::{Map, Value};
use std::collections::BTreeMap;

use crate::api::error::ApiError;

/// A lower bound from the schema (a 422 when broken, unlike the settings' bounds).
#[derive(Clone, Copy)]
pub enum Bound {
    None,
    /// Strictly greater than.
    Gt(f64),
    /// Greater than or equal.
    Ge(i128),
}

/// Walks one object's fields, collecting every error before answering, like the reference does.
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
    known: Vec<&'static str>,
    errors: Vec<String>,
}

impl<'a> Fields<'a> {
    pub fn new(obj: &'a Map<String, Value>) -> Fields<'a> {
        Fields {
            obj,
            known: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn error(&mut self, field: &str, msg: impl Into<String>) {
        self.errors.push(format!("body.{field}: {}", msg.into()));
    }

    /// Present and not null.
    fn take(&mut self, field: &'static str) -> Option<&'a Value> {
        self.known.push(field);
        self.obj.get(field).filter(|v| !v.is_null())
    }

    /// Present, possibly null: for fields whose default is not `null`, where `null` is an error.
    fn take_raw(&mut self, field: &'static str) -> Option<&'a Value> {
        self.known.push(field);
        self.obj.get(field)
    }

    pub fn opt_str(&mut self, field: &'static str, max_chars: Option<usize>) -> Option<String> {
        let value = self.take(field)?;
        match value {
            Value::String(s) => match max_chars {
                Some(max) if s.chars().count() > max => {
                    self.error(
                        field,
                        format!("String should have at most {max} characters"),
                    );
                    None
                }
                _ => Some(s.clone()),
            },
            _ => {
                self.error(field, "Input should be a valid string");
                None
            }
        }
    }

    /// One of `choices`, spelled exactly.
    pub fn opt_choice(
        &mut self,
        field: &'static str,
        choices: &[&'static str],
    ) -> Option<&'static str> {
        let value = self.opt_str(field, None)?;
        let found = choices.iter().find(|c| **c == value).copied();
        if found.is_none() {
            let list = choices
                .iter()
                .map(|c| format!("'{c}'"))
                .collect::<Vec<_>>()
                .join(" or ");
            self.error(field, format!("Input should be {list}"));
        }
        found
    }

    pub fn req_str(&mut self, field: &'static str) -> Option<String> {
        match self.take_raw(field) {
            None => {
                self.error(field, "Field required");
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                self.error(field, "Input should be a valid string");
                None
            }
        }
    }

    pub fn opt_float(&mut self, field: &'static str, bound: Bound) -> Option<f64> {
        let value = self.take(field)?;
        match lax_float(value) {
            Ok(v) => self.check_bound(field, v, bound).then_some(v),
            Err(msg) => {
                self.error(field, msg);
                None
            }
        }
    }

    pub fn opt_int(&mut self, field: &'static str, bound: Bound) -> Option<i128> {
        let value = self.take(field)?;
        self.int_value(field, value, bound)
    }

    pub fn req_int(&mut self, field: &'static str, bound: Bound) -> Option<i128> {
        match self.take_raw(field) {
            None => {
                self.error(field, "Field required");
                None
            }
            Some(value) => self.int_value(field, value, bound),
        }
    }

    fn int_value(&mut self, field: &str, value: &Value, bound: Bound) -> Option<i128> {
        match lax_int(value) {
            Ok(v) => self.check_bound(field, v as f64, bound).then_some(v),
            Err(msg) => {
                self.error(field, msg);
                None
            }
        }
    }

    fn check_bound(&mut self, field: &str, v: f64, bound: Bound) -> bool {
        match bound {
            Bound::Gt(min) if v.is_nan() || v <= min => {
                self.error(
                    field,
                    format!(
                        "Input should be greater than {}",
                        super::wire::py_number(min)
                    ),
                );
                false
            }
            Bound::Ge(min) if v.is_nan() || v < min as f64 => {
                self.error(
                    field,
                    format!("Input should be greater than or equal to {min}"),
                );
                false
            }
            _ => true,
        }
    }

    /// A boolean that may be left out or null.
    pub fn opt_bool(&mut self, field: &'static str) -> Option<bool> {
        let value = self.take(field)?;
        match lax_bool(value) {
            Ok(v) => Some(v),
            Err(msg) => {
                self.error(field, msg);
                None
            }
        }
    }

    /// A boolean with a default; `null` is refused.
    pub fn bool_or(&mut self, field: &'static str, default: bool) -> bool {
        match self.take_raw(field) {
            None => default,
            Some(value) => match lax_bool(value) {
                Ok(v) => v,
                Err(msg) => {
                    self.error(field, msg);
                    default
                }
            },
        }
    }

    /// A string-to-string map defaulting to empty; `null` is refused.
    pub fn env(&mut self, field: &'static str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        match self.take_raw(field) {
            None => {}
            Some(Value::Object(map)) => {
                for (key, value) in map {
                    match value {
                        Value::String(s) => {
                            out.insert(key.clone(), s.clone());
                        }
                        _ => {
                            self.error(&format!("{field}.{key}"), "Input should be a valid string")
                        }
                    }
                }
            }
            Some(_) => self.error(field, "Input should be a valid dictionary"),
        }
        out
    }

    /// The raw value of a field that needs its own reading (e.g. a union).
    pub fn raw(&mut self, field: &'static str) -> Option<&'a Value> {
        self.take_raw(field)
    }

    pub fn push_error(&mut self, field: &str, msg: impl Into<String>) {
        self.error(field, msg);
    }

    /// Refuses unknown fields and answers with every error found, or `Ok`.
    pub fn finish(mut self) -> Result<(), ApiError> {
        let extra: Vec<String> = self
            .obj
            .keys()
            .filter(|k| !self.known.contains(&k.as_str()))
            .cloned()
            .collect();
        for key in extra {
            self.error(&key, "Extra inputs are not permitted");
        }
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::Validation(self.errors.join("; ")))
        }
    }
}

/// Python's numeric string syntax: surrounding whitespace, and underscores between digits.
fn numeric_text(s: &str) -> Option<String> {
    let s = s.trim();
    let bytes = s.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'_' {
            let digit = |j: Option<&u8>| j.is_some_and(|c| c.is_ascii_digit());
            if i == 0 || !digit(bytes.get(i - 1)) || !digit(bytes.get(i + 1)) {
                return None;
            }
        }
    }
    Some(s.replace('_', ""))
}

fn lax_float(value: &Value) -> Result<f64, &'static str> {
    match value {
        Value::Number(n) => n.as_f64().ok_or("Input should be a valid number"),
        Value::Bool(b) => Ok(if *b { 1.0 } else { 0.0 }),
        Value::String(s) => numeric_text(s)
            .and_then(|t| t.parse::<f64>().ok())
            .ok_or("Input should be a valid number, unable to parse string as a number"),
        _ => Err("Input should be a valid number"),
    }
}

fn float_to_int(v: f64) -> Result<i128, &'static str> {
    if !v.is_finite() {
        return Err("Input should be a finite number");
    }
    if v.fract() != 0.0 {
        return Err("Input should be a valid integer, got a number with a fractional part");
    }
    // Saturating: anything this large fails the settings' range check anyway.
    Ok(v as i128)
}

fn lax_int(value: &Value) -> Result<i128, &'static str> {
    match value {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Ok(i128::from(u))
            } else {
                float_to_int(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::Bool(b) => Ok(i128::from(*b)),
        Value::String(s) => {
            let text = numeric_text(s)
                .ok_or("Input should be a valid integer, unable to parse string as an integer")?;
            if let Ok(i) = text.parse::<i128>() {
                return Ok(i);
            }
            match text.parse::<f64>() {
                Ok(v) if v.is_finite() && v.fract() == 0.0 => Ok(v as i128),
                _ => Err("Input should be a valid integer, unable to parse string as an integer"),
            }
        }
        _ => Err("Input should be a valid integer"),
    }
}

fn lax_bool(value: &Value) -> Result<bool, &'static str> {
    const MSG: &str = "Input should be a valid boolean, unable to interpret input";
    match value {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Ok(false),
            Some(1.0) => Ok(true),
            _ => Err(MSG),
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Ok(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Ok(true),
            _ => Err(MSG),
        },
        _ => Err("Input should be a valid boolean"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn coerces_like_the_reference() {
        let o = obj(
            json!({"cpus": "0.5", "memory_mb": "256", "pids_limit": 64.0, "network": 0,
            "read_only_rootfs": "no", "timeout_seconds": " 1_024 ", "big": 1e30}),
        );
        let mut f = Fields::new(&o);
        assert_eq!(f.opt_float("cpus", Bound::Gt(0.0)), Some(0.5));
        assert_eq!(f.opt_int("memory_mb", Bound::Ge(16)), Some(256));
        assert_eq!(f.opt_int("pids_limit", Bound::Ge(8)), Some(64));
        assert!(!f.bool_or("network", true));
        assert!(!f.bool_or("read_only_rootfs", true));
        assert_eq!(f.opt_int("timeout_seconds", Bound::Ge(1)), Some(1024));
        assert!(f.opt_int("big", Bound::Ge(1)).unwrap() > 1_000_000);
        f.finish().unwrap();
    }

    #[test]
    fn refuses_what_the_reference_refuses() {
        let o = obj(
            json!({"cpus": -1, "memory_mb": "x", "pids_limit": 2.5, "network": "maybe",
            "image": 5, "env": {"A": 1}, "zzz": 1}),
        );
        let mut f = Fields::new(&o);
        assert_eq!(f.opt_float("cpus", Bound::Gt(0.0)), None);
        assert_eq!(f.opt_int("memory_mb", Bound::Ge(16)), None);
        assert_eq!(f.opt_int("pids_limit", Bound::Ge(8)), None);
        f.bool_or("network", false);
        assert_eq!(f.opt_str("image", None), None);
        f.env("env");
        let err = f.finish().unwrap_err().to_string();
        for needle in [
            "body.cpus: Input should be greater than 0",
            "body.memory_mb",
            "body.pids_limit",
            "body.network",
            "body.image",
            "body.env.A",
            "body.zzz: Extra inputs are not permitted",
        ] {
            assert!(err.contains(needle), "{needle} missing from {err}");
        }
        let o = obj(json!({"network": null, "memory_mb": true}));
        let mut f = Fields::new(&o);
        f.bool_or("network", false);
        f.opt_int("memory_mb", Bound::Ge(16));
        let err = f.finish().unwrap_err().to_string();
        assert!(err.contains("body.network"), "{err}");
        assert!(err.contains("greater than or equal to 16"), "{err}");
    }
}
