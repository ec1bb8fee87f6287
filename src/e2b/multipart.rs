//! `multipart/form-data` bodies as envd's `POST /files` takes them: every part named `file`
//! whose `filename` is the path to write (or, with one file, the `path` of the query). Parsed
//! from a body already held in memory (bounded by the caller); a malformed body is refused,
//! never half-read.

/// One uploaded file: where it goes (`filename`) and its bytes.
#[derive(Debug, PartialEq)]
pub struct Part {
    pub name: String,
    pub filename: Option<String>,
    pub data: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MultipartError {
    #[error("the Content-Type names no multipart boundary")]
    NoBoundary,
    #[error("the multipart body is malformed: {0}")]
    Malformed(&'static str),
}

/// The boundary of a `multipart/form-data; boundary=…` content type.
pub fn boundary(content_type: &str) -> Result<String, MultipartError> {
    let (kind, params) = content_type.split_once(';').unwrap_or((content_type, ""));
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return Err(MultipartError::NoBoundary);
    }
    params
        .split(';')
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
        .filter(|b| !b.is_empty() && b.len() <= 200)
        .ok_or(MultipartError::NoBoundary)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Every part of `body`.
pub fn parse(body: &[u8], boundary: &str) -> Result<Vec<Part>, MultipartError> {
    let delimiter = format!("--{boundary}").into_bytes();
    let start = find(body, &delimiter).ok_or(MultipartError::Malformed("no first boundary"))?;
    let mut rest = &body[start + delimiter.len()..];
    let next_delimiter = [b"\r\n".as_slice(), &delimiter].concat();
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        rest = rest.strip_prefix(b"\r\n").ok_or(MultipartError::Malformed(
            "a boundary is not followed by a line end",
        ))?;
        let head_end = find(rest, b"\r\n\r\n")
            .ok_or(MultipartError::Malformed("a part has no headers end"))?;
        let head = std::str::from_utf8(&rest[..head_end])
            .map_err(|_| MultipartError::Malformed("part headers are not UTF-8"))?;
        let content = &rest[head_end + 4..];
        let end = find(content, &next_delimiter).ok_or(MultipartError::Malformed(
            "a part is not closed by a boundary",
        ))?;
        let (name, filename) = disposition(head)?;
        parts.push(Part {
            name,
            filename,
            data: content[..end].to_vec(),
        });
        rest = &content[end + next_delimiter.len()..];
    }
}

/// The `name` and `filename` of a part's `Content-Disposition: form-data`.
fn disposition(head: &str) -> Result<(String, Option<String>), MultipartError> {
    let line = head
        .split("\r\n")
        .find(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
        })
        .ok_or(MultipartError::Malformed(
            "a part has no Content-Disposition",
        ))?;
    let value = line.split_once(':').map(|(_, v)| v).unwrap_or("");
    let mut name = None;
    let mut filename = None;
    for param in split_params(value) {
        if let Some((k, v)) = param.split_once('=') {
            let v = unquote(v.trim());
            match k.trim().to_ascii_lowercase().as_str() {
                "name" => name = Some(v),
                "filename" => filename = Some(v),
                _ => {}
            }
        }
    }
    let name = name.ok_or(MultipartError::Malformed("a part has no name"))?;
    Ok((name, filename))
}

/// `;`-separated parameters, a quoted value may hold `;`.
fn split_params(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in value.chars() {
        match c {
            _ if escaped => {
                current.push(c);
                escaped = false;
            }
            '\\' if quoted => {
                current.push(c);
                escaped = true;
            }
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            ';' if !quoted => out.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    out.push(current);
    out
}

fn unquote(v: &str) -> String {
    match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::new();
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        out.push(n);
                    }
                } else {
                    out.push(c);
                }
            }
            out
        }
        None => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_keep_their_bytes_and_filenames() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a;b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n\x00\xff\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/w/c\"\r\n\r\n\r\n--XyZ--\r\n";
        let b = boundary("multipart/form-data; boundary=XyZ").unwrap();
        let parts = parse(body, &b).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].filename.as_deref(), Some("a;b.txt"));
        assert_eq!(parts[0].data, b"hello\r\n\x00\xff");
        assert_eq!(parts[1].filename.as_deref(), Some("/w/c"));
        assert!(parts[1].data.is_empty());
    }

    #[test]
    fn malformed_bodies_are_refused() {
        assert_eq!(
            boundary("application/json"),
            Err(MultipartError::NoBoundary)
        );
        assert!(parse(b"--B\r\nno headers end", "B").is_err());
        assert!(parse(
            b"--B\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nunclosed",
            "B"
        )
        .is_err());
    }
}
