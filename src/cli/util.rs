//! Small shared pieces of the client commands: durations as people type them, ages as kubectl
//! prints them, aligned tables, and the parsing of `KIND/NAME`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::resource::Kind;

/// `90`, `90s`, `1.5m`, `500ms`, `2h`: a plain number means seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?} (examples: 30s, 5m, 1h, 500ms)"))?;
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "invalid duration {text:?}: unit must be ms, s, m or h"
            ))
        }
    };
    Duration::try_from_secs_f64(value * scale).map_err(|_| format!("invalid duration {text:?}"))
}

/// kubectl's short ages: `45s`, `12m`, `5h`, `3d`.
pub fn short_duration(seconds: i64) -> String {
    let s = seconds.max(0);
    if s < 120 {
        format!("{s}s")
    } else if s < 120 * 60 {
        format!("{}m", s / 60)
    } else if s < 48 * 3600 {
        format!("{}h", s / 3600)
    } else {
        format!("{}d", s / 86400)
    }
}

/// Age of a timestamp (RFC 3339), or `<unknown>`.
pub fn age(timestamp: Option<&str>, now: DateTime<Utc>) -> String {
    match timestamp.and_then(|t| DateTime::parse_from_rfc3339(t).ok()) {
        Some(t) => short_duration((now - t.to_utc()).num_seconds()),
        None => "<unknown>".into(),
    }
}

/// Time left until a deadline: `14m`, `expired`, or `<none>`.
pub fn remaining(timestamp: Option<&str>, now: DateTime<Utc>) -> String {
    match timestamp.and_then(|t| DateTime::parse_from_rfc3339(t).ok()) {
        Some(t) => {
            let left = (t.to_utc() - now).num_seconds();
            if left <= 0 {
                "expired".into()
            } else {
                short_duration(left)
            }
        }
        None => "<none>".into(),
    }
}

/// Rows under upper-case headers, columns padded to the widest cell, three spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            text.push_str(cell);
            if i < last {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 3;
                text.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// `sandbox/demo` or (`sandbox`, `demo`) into a kind and a name.
pub fn kind_and_name(first: &str, second: Option<&str>) -> Result<(Kind, String), String> {
    match (first.split_once('/'), second) {
        (Some((kind, name)), None) if !name.is_empty() => Ok((kind.parse()?, name.to_string())),
        (None, Some(name)) => Ok((first.parse()?, name.to_string())),
        (Some(_), Some(_)) => Err(format!(
            "give either KIND/NAME or KIND NAME, not {first:?} and a name"
        )),
        _ => Err(format!("expected KIND/NAME or KIND NAME, got {first:?}")),
    }
}

/// A byte count for people: `10.0KiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5m").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_duration("5 days").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(short_duration(45), "45s");
        assert_eq!(short_duration(600), "10m");
        assert_eq!(short_duration(5 * 3600), "5h");
        assert_eq!(short_duration(3 * 86400), "3d");
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:10:00Z")
            .unwrap()
            .to_utc();
        assert_eq!(
            age(Some("2026-01-01T00:00:00Z"), now),
            "600s".replace("600s", "10m")
        );
        assert_eq!(remaining(Some("2026-01-01T00:09:00Z"), now), "expired");
        assert_eq!(remaining(None, now), "<none>");
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["NAME", "PHASE"],
            &[
                vec!["a".into(), "Running".into()],
                vec!["long-name".into(), "x".into()],
            ],
        );
        assert_eq!(t, "NAME        PHASE\na           Running\nlong-name   x\n");
    }

    #[test]
    fn kinds_and_names() {
        assert_eq!(
            kind_and_name("sandbox/x", None).unwrap(),
            (Kind::Sandbox, "x".into())
        );
        assert_eq!(
            kind_and_name("forks", Some("f")).unwrap(),
            (Kind::Fork, "f".into())
        );
        assert!(kind_and_name("sandbox", None).is_err());
        assert!(kind_and_name("pod/x", None).is_err());
    }

    #[test]
    fn byte_counts() {
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(10240), "10.0KiB");
    }
}
