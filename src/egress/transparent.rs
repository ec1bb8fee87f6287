//! The gateway's transparent listener: TCP a policed sandbox sends past the proxy (a client that
//! ignores the proxy variables, a raw socket, `git`) is redirected here by the host's firewall
//! (`crate::firewall`), and decided as the proxy decides. The original destination is read from
//! the redirected socket (`SO_ORIGINAL_DST`); the first bytes are peeked, not read: an HTTP
//! request is decided by its `Host`, TLS by the SNI of its ClientHello, anything else (or a
//! request without a name) by the original address and port against the list's CIDR entries.
//! A name is resolved here and the connection goes to an address just checked, as the proxy
//! does; HTTP and TLS to a Secret's host get the Secret's value put in (`inject`, `intercept`).
//! A refusal is a `403` for HTTP and a reset otherwise, at once, and logged with the rule.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::gateway::{Decision, Shared, Tenant};
use super::http1::{read_head, reply, send_then_splice, HEAD_TIMEOUT, MAX_HEAD};
use super::inject::inject;
use super::policy;

/// The port of the transparent listener on the bridge's host address.
pub const TRANSPARENT_PORT: u16 = 3129;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the first bytes are waited for when a CIDR entry allows the destination anyway (a
/// protocol where the server speaks first pays this once per connection).
const SNIFF_ALLOWED: Duration = Duration::from_millis(300);
/// How long the first bytes are waited for when only a name could allow the destination.
const SNIFF_NAMED: Duration = Duration::from_secs(3);
/// Connections served at once, all sandboxes together.
const MAX_CONNECTIONS: usize = 1024;

/// Serves the transparent listener until the task is aborted.
pub(super) async fn serve(shared: Arc<Shared>, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _permit = permit;
            let Some(_slot) = shared.bounds.connection(peer.ip()) else {
                reset(stream);
                return;
            };
            serve_client(&shared, stream, peer).await;
        });
    }
}

/// What the first bytes of a connection say.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Sniffed {
    /// An HTTP/1 request head, with its `Host` (without a port), if it has one.
    Http(Option<String>),
    /// A TLS ClientHello, with its server name, if it has one.
    Tls(Option<String>),
    /// Anything else, or nothing in time.
    Other,
}

impl Sniffed {
    fn protocol(&self) -> &'static str {
        match self {
            Sniffed::Http(_) => "http",
            Sniffed::Tls(_) => "tls",
            Sniffed::Other => "tcp",
        }
    }

    fn name(&self) -> Option<&str> {
        match self {
            Sniffed::Http(name) | Sniffed::Tls(name) => name.as_deref(),
            Sniffed::Other => None,
        }
    }
}

/// What `bytes` (the start of a connection) are, or `None` when more are needed to tell.
pub(super) fn classify(bytes: &[u8]) -> Option<Sniffed> {
    if bytes.is_empty() {
        return None;
    }
    if bytes[0] == 0x16 {
        if bytes.len() < 5 {
            return None;
        }
        let record = 5 + u16::from_be_bytes([bytes[3], bytes[4]]) as usize;
        if bytes.len() < record.min(MAX_HEAD) {
            return None;
        }
        return Some(Sniffed::Tls(server_name(bytes)));
    }
    let token = bytes.iter().take_while(|b| b.is_ascii_uppercase()).count();
    if token == 0 || token > 16 {
        return Some(Sniffed::Other);
    }
    if bytes.len() == token {
        return None;
    }
    if bytes[token] != b' ' {
        return Some(Sniffed::Other);
    }
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        // A head longer than the gateway reads has no name it will look at.
        return (bytes.len() >= MAX_HEAD).then_some(Sniffed::Http(None));
    };
    Some(Sniffed::Http(host_header(&bytes[..end])))
}

/// The `Host` header of a request head, lowercased, without its port.
fn host_header(head: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(head).ok()?;
    let value = text.split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim())
    })?;
    let host = if let Some(rest) = value.strip_prefix('[') {
        rest.split_once(']')?.0
    } else {
        value.rsplit_once(':').map_or(value, |(host, _)| host)
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    (valid_name(&host) || host.parse::<IpAddr>().is_ok()).then_some(host)
}

fn valid_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

/// The server name of a ClientHello (rustls reads it; nothing is answered).
fn server_name(bytes: &[u8]) -> Option<String> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut reader = bytes;
    acceptor.read_tls(&mut reader).ok()?;
    let accepted = acceptor.accept().ok()??;
    let name = accepted.client_hello().server_name()?.to_ascii_lowercase();
    let name = name.trim_end_matches('.').to_string();
    valid_name(&name).then_some(name)
}

/// Waits up to `wait` for the first bytes and classifies them, without taking them off the
/// socket.
async fn sniff(stream: &TcpStream, wait: Duration) -> Sniffed {
    let deadline = Instant::now() + wait;
    let mut buffer = vec![0u8; MAX_HEAD];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Ok(read)) = tokio::time::timeout(left, stream.peek(&mut buffer)).await else {
            return Sniffed::Other;
        };
        if read == 0 {
            return Sniffed::Other;
        }
        if let Some(sniffed) = classify(&buffer[..read]) {
            return sniffed;
        }
        // More of the head is on its way: peeking again at once would see the same bytes.
        if Instant::now() >= deadline {
            return Sniffed::Other;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The destination a redirected connection was sent to.
fn original_destination(stream: &TcpStream) -> Option<SocketAddr> {
    use std::os::fd::AsRawFd;
    let mut address: libc::sockaddr_in = libc::sockaddr_in {
        sin_family: 0,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: 0 },
        sin_zero: [0; 8],
    };
    let mut length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: the buffer is a sockaddr_in and `length` says its size; the descriptor is open
    // for as long as `stream` is borrowed.
    let done = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&mut address as *mut libc::sockaddr_in).cast(),
            &mut length,
        )
    };
    if done != 0 || i32::from(address.sin_family) != libc::AF_INET {
        return None;
    }
    let ip = Ipv4Addr::from(u32::from_be(address.sin_addr.s_addr));
    Some(SocketAddr::new(
        IpAddr::V4(ip),
        u16::from_be(address.sin_port),
    ))
}

/// Closes `stream` with a reset, so that the client fails at once.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn serve_client(shared: &Shared, mut client: TcpStream, peer: SocketAddr) {
    let Some(tenant) = shared.tenant(peer.ip()).await else {
        reset(client);
        return;
    };
    let Some(destination) = original_destination(&client) else {
        reset(client);
        return;
    };
    let (address, port) = (destination.ip(), destination.port());
    let rules = &tenant.rules;
    let protected = shared.protected();
    let by_address = policy::decide_address(rules, &protected, address, port, None);
    let wait = if by_address.allowed {
        SNIFF_ALLOWED
    } else {
        SNIFF_NAMED
    };
    let sniffed = sniff(&client, wait).await;
    let protocol = sniffed.protocol();
    let (host, mut addresses, verdict) = match sniffed.name() {
        // A name decides, as it does through the proxy; its checked addresses are dialled,
        // the one the client chose first.
        Some(name) if name.parse::<IpAddr>().is_err() => {
            let mut addresses = if policy::rule_for_name(rules, name, port).is_some() {
                shared.resolve(name).await
            } else {
                Vec::new()
            };
            let verdict = policy::decide_name(rules, &protected, name, port, &addresses);
            if let Some(at) = addresses.iter().position(|a| *a == address) {
                addresses.swap(0, at);
            }
            (name.to_string(), addresses, verdict)
        }
        _ => (address.to_string(), vec![address], by_address),
    };
    let mut decision = Decision::new(
        protocol,
        &host,
        Some(address),
        Some(port),
        verdict.allowed,
        verdict.rule.clone(),
    );
    if !verdict.allowed {
        shared.record(&tenant.sandbox, decision);
        if matches!(sniffed, Sniffed::Http(_)) {
            let reason = format!("egress denied: {}", verdict.rule);
            reply(&mut client, "403 Forbidden", &reason).await;
        } else {
            reset(client);
        }
        return;
    }
    let mut upstream = None;
    for candidate in addresses.drain(..) {
        let dial = TcpStream::connect(SocketAddr::new(candidate, port));
        if let Ok(Ok(stream)) = tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
            decision.address = Some(candidate);
            upstream = Some(stream);
            break;
        }
    }
    let Some(mut upstream) = upstream else {
        decision.rule = format!("{} (allowed; upstream unreachable)", verdict.rule);
        shared.record(&tenant.sandbox, decision);
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let secret = sniffed.name().is_some() && super::intercept::wanted(shared, &tenant, &host, port);
    match sniffed {
        Sniffed::Tls(_) if secret => {
            super::intercept::serve(shared, &tenant, client, upstream, &host, port, decision).await;
        }
        Sniffed::Http(_) if secret => {
            let outcome = with_secret(shared, &tenant, client, upstream, &host, port).await;
            match outcome {
                Ok((out, back)) => (decision.bytes_out, decision.bytes_in) = (out, back),
                Err(reason) => decision.rule = format!("{} (allowed; {reason})", decision.rule),
            }
            shared.record(&tenant.sandbox, decision);
        }
        _ => {
            let copied = super::relay::sockets(&mut client, &mut upstream).await;
            (decision.bytes_out, decision.bytes_in) = copied.unwrap_or((0, 0));
            shared.record(&tenant.sandbox, decision);
        }
    }
}

/// Plain HTTP to a Secret's host: the head is read, given the value where it applies, and sent
/// on (one request per connection, as through the proxy).
async fn with_secret(
    shared: &Shared,
    tenant: &Tenant,
    mut client: TcpStream,
    mut upstream: TcpStream,
    host: &str,
    port: u16,
) -> Result<(u64, u64), String> {
    let (head, early) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Ok(read)) => read,
        Ok(Err(reason)) => return Err(reason.to_string()),
        Err(_) => return Err("request head too slow".into()),
    };
    let head = match super::intercept::origin_head(&head) {
        Ok(head) => head,
        Err(reason) => {
            reply(&mut client, "400 Bad Request", reason).await;
            return Err(reason.to_string());
        }
    };
    let (head, _) = inject(&shared.store, tenant, host, port, head).await;
    send_then_splice(&mut client, &mut upstream, &head, &early).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bytes_are_told_apart() {
        assert_eq!(classify(b""), None);
        assert_eq!(classify(b"GE"), None);
        assert_eq!(classify(b"GET / HTTP/1.1\r\nHost: a"), None);
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nhost: Up.Example.test:8000\r\n\r\n"),
            Some(Sniffed::Http(Some("up.example.test".into())))
        );
        assert_eq!(
            classify(b"GET / HTTP/1.0\r\n\r\n"),
            Some(Sniffed::Http(None))
        );
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n"),
            Some(Sniffed::Http(Some("2001:db8::1".into())))
        );
        assert_eq!(classify(b"SSH-2.0-OpenSSH\r\n"), Some(Sniffed::Other));
        assert_eq!(classify(b"\x00\x00\x00\x08"), Some(Sniffed::Other));
        assert_eq!(classify(b"\x16\x03\x01"), None);
        // A record that is no ClientHello has no name.
        assert_eq!(
            classify(b"\x16\x03\x01\x00\x02ab"),
            Some(Sniffed::Tls(None))
        );
    }

    #[test]
    fn the_server_name_of_a_real_client_hello_is_read() {
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("Files.Example.org").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut hello = Vec::new();
        client.write_tls(&mut hello).unwrap();
        assert_eq!(classify(&hello[..3]), None);
        assert_eq!(
            classify(&hello),
            Some(Sniffed::Tls(Some("files.example.org".into())))
        );
    }
}
