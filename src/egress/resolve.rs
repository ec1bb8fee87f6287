//! Reading a hosts-format file (`AGENT_SANDBOX_EGRESS_HOSTS`): `address name [alias ...]` per
//! line, `#` starting a comment. Lines that are not that are skipped, never fatal.

use std::net::IpAddr;

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
}
