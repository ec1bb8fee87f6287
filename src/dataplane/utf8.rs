//! An incremental UTF-8 decoder for streamed output: a character split across two reads is held
//! back and completed by the next one; invalid bytes become U+FFFD, one per maximal invalid
//! sequence, like `String::from_utf8_lossy`. It owns no I/O.

/// Decodes one byte stream piece by piece.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    /// The bytes of an incomplete character at the end of the last piece (at most 3).
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Utf8Stream {
        Utf8Stream::default()
    }

    /// Decodes `bytes` after whatever was held back; returns the text that is complete so far.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(bytes);
        let mut out = String::with_capacity(buf.len());
        let mut rest: &[u8] = &buf;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // The prefix was just validated, so this cannot fail.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                        None => {
                            // An incomplete character at the very end: wait for the rest.
                            self.pending = bad.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    /// Flushes a character that never completed (as one U+FFFD).
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            String::new()
        } else {
            self.pending.clear();
            char::REPLACEMENT_CHARACTER.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_are_joined() {
        let text = "aé€😀z".as_bytes();
        for cut in 0..text.len() {
            let mut d = Utf8Stream::new();
            let mut out = d.push(&text[..cut]);
            out.push_str(&d.push(&text[cut..]));
            out.push_str(&d.finish());
            assert_eq!(out, "aé€😀z", "cut at {cut}");
        }
        let mut d = Utf8Stream::new();
        let mut out = String::new();
        for b in text {
            out.push_str(&d.push(std::slice::from_ref(b)));
        }
        assert_eq!(out, "aé€😀z");
    }

    #[test]
    fn invalid_bytes_are_replaced_like_lossy() {
        for bytes in [
            &b"a\xffb"[..],
            b"\xc3\x28",
            b"\xe2\x82",
            b"ok\xf0\x9f\x98",
            b"\xed\xa0\x80x",
        ] {
            let mut d = Utf8Stream::new();
            let mut out = d.push(bytes);
            out.push_str(&d.finish());
            assert_eq!(out, String::from_utf8_lossy(bytes), "{bytes:?}");
        }
    }
}
