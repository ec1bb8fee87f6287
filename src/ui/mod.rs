//! The dashboard at `/ui`: its page, script and style, embedded in the binary (no file is read
//! and nothing is fetched from elsewhere at run time), and the sign-in page a browser without a
//! session gets.
//!
//! It owns what a browser is sent and the headers that keep those documents to themselves
//! (a Content-Security-Policy that allows this server's own script, style and connections only).
//! It does not judge keys or sessions (`crate::api::auth` and `crate::api::session` do) and does
//! not route (`crate::api::ui` does). The script reads and writes through the resource API and
//! `/v1`, like any other client, with the session cookie instead of a key header.

/// The dashboard's one page; the script draws every view into it.
pub const APP_PAGE: &str = include_str!("assets/index.html");
/// The dashboard's script (vanilla JavaScript).
pub const SCRIPT: &str = include_str!("assets/app.js");
/// The style of the dashboard and of the sign-in page.
pub const STYLE: &str = include_str!("assets/app.css");
const SIGN_IN_PAGE: &str = include_str!("assets/sign-in.html");

/// Headers every dashboard document goes out with: only this server's own script, style and
/// connections; never framed; no referrer to other origins (`no-referrer` would make the browser
/// send `Origin: null` with the page's own writes, which the session refuses); never cached
/// (pages can hold sandbox data).
pub const SECURITY_HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "same-origin"),
    ("cache-control", "no-store"),
    ("x-content-type-options", "nosniff"),
];

/// Why a sign-in page is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignIn {
    /// No session yet, or it ended.
    Needed,
    /// The key given was not accepted.
    Refused,
}

/// The sign-in page: a form that posts the key to `/ui/login`. It never echoes what was typed.
pub fn sign_in_page(why: SignIn) -> String {
    let message = match why {
        SignIn::Needed => "Sign in with an API key of this server.",
        SignIn::Refused => "That key is not accepted. Try again.",
    };
    SIGN_IN_PAGE.replace("{{message}}", message)
}

/// The value of the field `name` in an `application/x-www-form-urlencoded` body (`+` is a space,
/// `%XX` a byte); `None` when it is missing or not UTF-8.
pub fn form_field(body: &[u8], name: &str) -> Option<String> {
    body.split(|b| *b == b'&').find_map(|pair| {
        let (field, value) = match pair.iter().position(|b| *b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &[][..]),
        };
        (decode(field)? == name).then(|| decode(value)).flatten()
    })
}

fn decode(text: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [*bytes.next()?, *bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            other => out.push(other),
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_fields_are_decoded() {
        let body = b"other=1&key=ab%2Bc+d%3D&x";
        assert_eq!(form_field(body, "key").as_deref(), Some("ab+c d="));
        assert_eq!(form_field(body, "x").as_deref(), Some(""));
        assert_eq!(form_field(body, "missing"), None);
        assert_eq!(form_field(b"key=%zz", "key"), None);
        assert_eq!(form_field(b"key=%4", "key"), None);
        assert_eq!(form_field(b"key=%ff", "key"), None);
    }

    #[test]
    fn pages_fetch_nothing_from_elsewhere() {
        for text in [APP_PAGE, SCRIPT, STYLE, SIGN_IN_PAGE] {
            for outside in ["http://", "https://", "//cdn", "@import"] {
                assert!(!text.contains(outside), "{outside} in an embedded asset");
            }
        }
        // No inline script or style: the policy would refuse it.
        assert!(!APP_PAGE.contains("<script>") && !APP_PAGE.contains("<style"));
        assert!(!SIGN_IN_PAGE.contains("<script") && !SIGN_IN_PAGE.contains("<style"));
    }

    #[test]
    fn the_sign_in_page_says_why() {
        assert!(sign_in_page(SignIn::Refused).contains("not accepted"));
        assert!(!sign_in_page(SignIn::Needed).contains("{{"));
    }
}
