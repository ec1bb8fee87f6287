//! How long a name's addresses hold, and where they come from besides the host's resolver:
//! reading a hosts-format file (`AGENT_SANDBOX_EGRESS_HOSTS`: `address name [alias ...]` per
//! line, `#` starting a comment; lines that are not that are skipped, never fatal), and the
//! answers of the host's resolver kept for as long as the gateway's DNS server tells sandboxes
//! to keep them ([`Answers`]). It decides nothing and does no lookup itself.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long an answer holds: sandboxes are told to keep the gateway's DNS answers this long (their
/// TTL), and the gateway keeps the host resolver's answers as long, so that the connection that
/// follows a sandbox's lookup is dialled to what it was answered without asking the host's
/// resolver again. Short, so that a list edit applies soon to lookups too.
pub(super) const ANSWER_LIFETIME: Duration = Duration::from_secs(5);
/// Names whose answers are kept at most (beyond it, expired answers go, then all of them).
const MAX_NAMES: usize = 4096;

/// The host resolver's recent answers, by name (lowercase, without a trailing dot). Empty
/// answers are not kept: a name that did not resolve is asked again at the next connection.
#[derive(Debug, Default)]
pub(super) struct Answers {
    names: HashMap<String, (Instant, Vec<IpAddr>)>,
}

impl Answers {
    /// What `name` resolved to less than [`ANSWER_LIFETIME`] before `now`.
    pub(super) fn get(&self, name: &str, now: Instant) -> Option<Vec<IpAddr>> {
        let (at, addresses) = self.names.get(&key(name))?;
        (now.saturating_duration_since(*at) < ANSWER_LIFETIME).then(|| addresses.clone())
    }

    /// Keeps what `name` resolved to at `now`.
    pub(super) fn keep(&mut self, name: &str, addresses: &[IpAddr], now: Instant) {
        if addresses.is_empty() {
            return;
        }
        if self.names.len() >= MAX_NAMES {
            self.names
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ANSWER_LIFETIME);
            if self.names.len() >= MAX_NAMES {
                self.names.clear();
            }
        }
        self.names.insert(key(name), (now, addresses.to_vec()));
    }
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The addresses `name` has in `text` (any case, trailing dot ignored), in file order.
pub fn from_hosts(text: &str, name: &str) -> Vec<IpAddr> {
    let name = name.trim_end_matches('.');
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let Some(Ok(address)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        if fields.any(|alias| alias.trim_end_matches('.').eq_ignore_ascii_case(name))
            && !found.contains(&address)
        {
            found.push(address);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_are_found_and_junk_is_skipped() {
        let text = "# comment\n203.0.113.5 Up.Example.org up # trailing\nnot-an-ip x.org\n\
                    2001:db8::5 up.example.org\n203.0.113.5 up.example.org\n\n   \n10.0.0.1\n";
        let found = from_hosts(text, "up.example.org.");
        assert_eq!(
            found,
            [
                "203.0.113.5".parse::<IpAddr>().unwrap(),
                "2001:db8::5".parse().unwrap()
            ]
        );
        assert_eq!(from_hosts(text, "up").len(), 1);
        assert!(from_hosts(text, "x.org").is_empty());
        assert!(from_hosts(text, "example.org").is_empty());
    }

    #[test]
    fn answers_hold_for_their_lifetime_by_name_and_stay_bounded() {
        let start = Instant::now();
        let address: IpAddr = "203.0.113.7".parse().unwrap();
        let mut answers = Answers::default();
        answers.keep("Up.Example.org.", &[address], start);
        answers.keep("none.example.org", &[], start);
        let soon = start + ANSWER_LIFETIME - Duration::from_millis(1);
        assert_eq!(answers.get("up.example.org", soon), Some(vec![address]));
        assert_eq!(answers.get("none.example.org", soon), None);
        assert_eq!(answers.get("up.example.org", start + ANSWER_LIFETIME), None);

        for i in 0..MAX_NAMES - 1 {
            answers.keep(&format!("n{i}.example.org"), &[address], start);
        }
        assert_eq!(answers.names.len(), MAX_NAMES);
        // Full of live answers: they all go, and the new one is kept.
        answers.keep("last.example.org", &[address], soon);
        assert_eq!(answers.names.len(), 1);
        assert_eq!(answers.get("last.example.org", soon), Some(vec![address]));
        // Full again, all expired but one: only the expired go.
        let later = start + ANSWER_LIFETIME * 3;
        for i in 0..MAX_NAMES - 2 {
            answers.keep(&format!("m{i}.example.org"), &[address], start);
        }
        answers.keep("live.example.org", &[address], later);
        assert_eq!(answers.names.len(), MAX_NAMES);
        answers.keep("newest.example.org", &[address], later);
        assert_eq!(answers.names.len(), 2);
        assert_eq!(answers.get("live.example.org", later), Some(vec![address]));
    }
}
