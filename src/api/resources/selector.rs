//! `?labelSelector=`: the equality-based subset of Kubernetes label selectors
//! (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated, all must hold).

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

fn key(text: &str) -> Result<String, String> {
    let key = text.trim();
    if key.is_empty() || key.contains(|c: char| c.is_whitespace() || "=!,".contains(c)) {
        return Err(format!("invalid label selector: bad key {text:?}"));
    }
    Ok(key.to_string())
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let requirement = if let Some((k, v)) = item.split_once("!=") {
                Requirement::NotEquals(key(k)?, v.trim().to_string())
            } else if let Some((k, v)) = item.split_once("==") {
                Requirement::Equals(key(k)?, v.trim().to_string())
            } else if let Some((k, v)) = item.split_once('=') {
                Requirement::Equals(key(k)?, v.trim().to_string())
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
    }
}
