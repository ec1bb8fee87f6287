//! The gateway's HTTP proxy: absolute-URI requests (plain HTTP, routed by their host, with the
//! sandbox's Secrets put in where they apply, see `inject`) and `CONNECT` tunnels (TLS carried
//! end to end, never intercepted). Each is decided against the
//! speaking sandbox's list before anything leaves; the name is resolved here and the connection
//! goes to an address that was checked, so a name that rebinds to a protected address gets
//! nowhere. Refusals are a `403` with the reason, at once.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::gateway::{Decision, Shared};
use super::http1::{end_to_end_headers, read_head, reply, HEAD_TIMEOUT};
use super::inject::inject;
use super::policy;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once, all sandboxes together; more wait to be accepted. Each sandbox
/// holds at most `bounds::MAX_CONNECTIONS_PER_SANDBOX` of them.
const MAX_CONNECTIONS: usize = 1024;

/// Serves the proxy on `listener` until the task is aborted.
pub(super) async fn serve(shared: Arc<Shared>, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Ok((mut stream, peer)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _permit = permit;
            // One sandbox holding many connections (even idle ones) leaves the others served.
            let Some(_slot) = shared.bounds.connection(peer.ip()) else {
                reply(
                    &mut stream,
                    "429 Too Many Requests",
                    "egress denied: this sandbox holds too many proxy connections",
                )
                .await;
                return;
            };
            let _ = serve_client(&shared, stream, peer).await;
        });
    }
}

/// A request as far as the proxy reads it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Request {
    pub connect: bool,
    pub host: String,
    pub port: u16,
    /// For plain HTTP: the head to send upstream (origin-form target, hop-by-hop and proxy
    /// headers removed, `Connection: close`).
    pub upstream_head: Vec<u8>,
}

/// Parses a request head (up to and including the blank line).
pub(super) fn parse_head(head: &[u8]) -> Result<Request, &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed request line");
    };
    if !version.starts_with("HTTP/1.") {
        return Err("only HTTP/1.x is proxied");
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None)?;
        return Ok(Request {
            connect: true,
            host,
            port,
            upstream_head: Vec::new(),
        });
    }
    let Some(rest) = target
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case("http://"))
        .map(|_| &target[7..])
    else {
        return Err("a proxied request needs an absolute http:// URI (use CONNECT for https)");
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let (host, port) = split_authority(authority, Some(80))?;
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('/') => p.to_string(),
        p => format!("/{p}"),
    };
    let mut upstream = format!("{method} {path} {version}\r\n");
    end_to_end_headers(lines, &mut upstream);
    Ok(Request {
        connect: false,
        host,
        port,
        upstream_head: upstream.into_bytes(),
    })
}

/// `host[:port]` or `[v6][:port]`, lowercased; `default` when the port is left out (CONNECT
/// needs one).
fn split_authority(authority: &str, default: Option<u16>) -> Result<(String, u16), &'static str> {
    if authority.contains('@') {
        return Err("credentials in the URI are not proxied");
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed [ in the host")?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or("bad port")?,
        None => default.ok_or("CONNECT needs host:port")?,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let is_name = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if !is_name && host.parse::<IpAddr>().is_err() {
        return Err("bad host");
    }
    Ok((host, port))
}

async fn serve_client(
    shared: &Shared,
    mut client: TcpStream,
    peer: SocketAddr,
) -> std::io::Result<()> {
    let Some(tenant) = shared.tenant(peer.ip()).await else {
        reply(
            &mut client,
            "403 Forbidden",
            "egress denied: not a policed sandbox",
        )
        .await;
        return Ok(());
    };
    let head = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await;
    let (head, early) = match head {
        Ok(Ok(read)) => read,
        Ok(Err(reason)) => {
            reply(&mut client, "400 Bad Request", reason).await;
            return Ok(());
        }
        Err(_) => {
            reply(&mut client, "408 Request Timeout", "request head too slow").await;
            return Ok(());
        }
    };
    let request = match parse_head(&head) {
        Ok(request) => request,
        Err(reason) => {
            reply(&mut client, "400 Bad Request", reason).await;
            return Ok(());
        }
    };
    let protocol = if request.connect { "tls" } else { "http" };
    let (host, port) = (request.host.as_str(), request.port);
    let rules = &tenant.rules;
    let protected = shared.protected();
    let (addresses, verdict) = match host.parse::<IpAddr>() {
        Ok(address) => (
            vec![address],
            policy::decide_address(rules, &protected, address, port, None),
        ),
        Err(_) if policy::rule_for_name(rules, host, port).is_none() => (
            Vec::new(),
            policy::decide_name(rules, &protected, host, port, &[]),
        ),
        Err(_) => {
            let addresses = shared.resolve(host).await;
            let verdict = policy::decide_name(rules, &protected, host, port, &addresses);
            (addresses, verdict)
        }
    };
    let mut decision = Decision::new(
        protocol,
        host,
        addresses.first().copied(),
        Some(port),
        verdict.allowed,
        verdict.rule.clone(),
    );
    if !verdict.allowed {
        shared.record(&tenant.sandbox, decision);
        reply(
            &mut client,
            "403 Forbidden",
            &format!("egress denied: {}", verdict.rule),
        )
        .await;
        return Ok(());
    }
    // Only the addresses just checked are dialled: no second lookup to rebind.
    let mut upstream = None;
    for address in &addresses {
        let dial = TcpStream::connect(SocketAddr::new(*address, port));
        if let Ok(Ok(stream)) = tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
            decision.address = Some(*address);
            upstream = Some(stream);
            break;
        }
    }
    let Some(mut upstream) = upstream else {
        decision.rule = format!("{} (allowed; upstream unreachable)", verdict.rule);
        shared.record(&tenant.sandbox, decision);
        reply(&mut client, "502 Bad Gateway", "upstream unreachable").await;
        return Ok(());
    };
    // Each write is passed on at once: with Nagle's algorithm a relayed small write (a TLS
    // handshake's, an answer's head) could wait for the peer's delayed ACK, tens of milliseconds.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let mut sent = 0u64;
    if request.connect {
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        // To a host one of the sandbox's Secrets names, TLS ends here (a ClientHello sent
        // before the 200 was read cannot be taken over: such a tunnel stays end to end).
        if early.is_empty() && super::intercept::wanted(shared, &tenant, host, port) {
            super::intercept::serve(shared, &tenant, client, upstream, host, port, decision).await;
            return Ok(());
        }
    } else {
        // Only the head is read: a placeholder in the body or a later request on the same
        // connection stays as it is (the upstream is told `Connection: close`).
        let (head, _) = inject(&shared.store, &tenant, host, port, request.upstream_head).await;
        upstream.write_all(&head).await?;
        sent += head.len() as u64;
    }
    if !early.is_empty() {
        upstream.write_all(&early).await?;
        sent += early.len() as u64;
    }
    let copied = super::relay::sockets(&mut client, &mut upstream).await;
    let (out, back) = copied.unwrap_or((0, 0));
    decision.bytes_out = sent + out;
    decision.bytes_in = back;
    shared.record(&tenant.sandbox, decision);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_requests_are_rewritten_for_the_upstream() {
        let head = b"GET http://Up.Example.org:8080/a?b=1 HTTP/1.1\r\nHost: up.example.org:8080\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: x\r\nAccept: */*\r\n\r\n";
        let request = parse_head(head).unwrap();
        assert!(!request.connect);
        assert_eq!(
            (request.host.as_str(), request.port),
            ("up.example.org", 8080)
        );
        let upstream = String::from_utf8(request.upstream_head).unwrap();
        assert_eq!(
            upstream,
            "GET /a?b=1 HTTP/1.1\r\nHost: up.example.org:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let bare = parse_head(b"GET http://a.org HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(bare.port, 80);
        assert!(bare.upstream_head.starts_with(b"GET / HTTP/1.0\r\n"));
    }

    #[test]
    fn connect_targets_need_a_port_and_hostile_heads_are_refused() {
        let tunnel = parse_head(b"CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n").unwrap();
        assert!(tunnel.connect);
        assert_eq!((tunnel.host.as_str(), tunnel.port), ("2001:db8::1", 443));
        for bad in [
            &b"CONNECT a.org HTTP/1.1\r\n\r\n"[..],
            b"CONNECT a.org:0 HTTP/1.1\r\n\r\n",
            b"CONNECT a.org:99999 HTTP/1.1\r\n\r\n",
            b"GET /relative HTTP/1.1\r\n\r\n",
            b"GET https://a.org/ HTTP/1.1\r\n\r\n",
            b"GET http://user:pw@a.org/ HTTP/1.1\r\n\r\n",
            b"GET http://a b.org/ HTTP/1.1\r\n\r\n",
            b"GET http://a.org/ HTTP/2\r\n\r\n",
            b"GET http://[::1/ HTTP/1.1\r\n\r\n",
            b"GET http://a%2e.org/ HTTP/1.1\r\n\r\n",
            b"\xff\xfe\r\n\r\n",
            b"",
        ] {
            assert!(
                parse_head(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
