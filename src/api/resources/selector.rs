//! `?labelSelector=`: the equality-based subset of Kubernetes label selectors
//! (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated, all must hold). Keys and values may hold
//! any character but `=`, `!`, `,` and control characters (labels are free text), keys no space,
//! values no space at either end; spaces may surround items and operators. [`PATTERN`] says the
//! same for the OpenAPI document.

use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// The grammar [`LabelSelector::parse`] accepts, as a regular expression (ECMA/JSON Schema).
pub const PATTERN: &str = concat!(
    "^ *$|^ *(! *[^ =!,\\u0000-\\u001f\\u007f-\\u009f]+|[^ =!,\\u0000-\\u001f\\u007f-\\u009f]+( *(==|!=|=) *([^ =!,\\u0000-\\u001f\\u007f-\\u009f]([^=!,\\u0000-\\u001f\\u007f-\\u009f]*[^ =!,\\u0000-\\u001f\\u007f-\\u009f])?)?)?)",
    " *(, *(! *[^ =!,\\u0000-\\u001f\\u007f-\\u009f]+|[^ =!,\\u0000-\\u001f\\u007f-\\u009f]+( *(==|!=|=) *([^ =!,\\u0000-\\u001f\\u007f-\\u009f]([^=!,\\u0000-\\u001f\\u007f-\\u009f]*[^ =!,\\u0000-\\u001f\\u007f-\\u009f])?)?)?) *)*$",
);

fn spaces(text: &str) -> &str {
    text.trim_matches(' ')
}

/// Not an operator, separator or control character.
fn plain(c: char) -> bool {
    !"=!,".contains(c) && !c.is_control()
}

fn key(text: &str) -> Result<String, String> {
    let key = spaces(text);
    if key.is_empty() || !key.chars().all(|c| c != ' ' && plain(c)) {
        return Err(format!("invalid label selector: bad key {text:?}"));
    }
    Ok(key.to_string())
}

fn value(text: &str) -> Result<String, String> {
    let value = spaces(text);
    if !value.chars().all(plain) {
        return Err(format!("invalid label selector: bad value {text:?}"));
    }
    Ok(value.to_string())
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        if spaces(text).is_empty() {
            return Ok(LabelSelector { requirements });
        }
        for item in text.split(',').map(spaces) {
            if item.is_empty() {
                return Err(format!(
                    "invalid label selector: empty requirement in {text:?}"
                ));
            }
            let requirement = if let Some((k, v)) = item.split_once("!=") {
                Requirement::NotEquals(key(k)?, value(v)?)
            } else if let Some((k, v)) = item.split_once("==") {
                Requirement::Equals(key(k)?, value(v)?)
            } else if let Some((k, v)) = item.split_once('=') {
                Requirement::Equals(key(k)?, value(v)?)
            } else if let Some(k) = item.strip_prefix('!') {
                Requirement::Absent(key(k)?)
            } else {
                Requirement::Exists(key(item)?)
            };
            requirements.push(requirement);
        }
        Ok(LabelSelector { requirements })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::Absent(k) => !labels.contains_key(k),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selects() {
        let l = labels(&[("team", "research"), ("tier", "gpu")]);
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&l);
        assert!(m(""));
        assert!(m("team=research"));
        assert!(m("team==research, tier"));
        assert!(!m("team=infra"));
        assert!(m("team!=infra"));
        assert!(!m("!tier"));
        assert!(m("!missing"));
        assert!(!m("team=research,missing"));
        assert!(LabelSelector::parse("=x").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
        assert!(LabelSelector::parse("a=b=c").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
        assert!(LabelSelector::parse("a\t").is_err());
        assert!(LabelSelector::parse(" ").unwrap().matches(&l));
        assert!(m(" ! missing , team = research "));
        assert!(m("example.com/x!=y"));
        assert!(LabelSelector::parse("a=b==c").is_err());
        assert!(LabelSelector::parse("a=b!c").is_err());
        let free = labels(&[("équipe", "r et d")]);
        assert!(LabelSelector::parse(" équipe = r et d ")
            .unwrap()
            .matches(&free));
    }
}
