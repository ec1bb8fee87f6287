//! HTTPS to the hosts of a sandbox's Secrets: the `CONNECT` tunnel is answered, TLS is ended with
//! a leaf of the gateway's own authority (which the sandbox trusts through its CA bundle), the
//! request head is read and given the Secret's value where it applies (`inject`), and the request
//! goes on over a new TLS connection to the checked address, verified against the host's roots
//! and `AGENT_SANDBOX_EGRESS_EXTRA_CA`. One request per connection (`Connection: close` upstream);
//! a placeholder in a body or in a later request on the connection is left as it is. Only hosts
//! a Secret of the sandbox names are taken over; every other tunnel stays end to end. The
//! decision on whether the connection may be made is the proxy's, taken before.

use std::sync::Arc;

use tokio::net::TcpStream;

use super::gateway::{Decision, Shared, Tenant};
use super::http1::{end_to_end_headers, read_head, reply, send_then_splice, HEAD_TIMEOUT};
use super::inject::inject;
use crate::resource::Kind;

/// Whether a tunnel of `tenant` to `host:port` is one to take over: a Secret of it names the
/// host, and the gateway has an authority.
pub(super) fn wanted(shared: &Shared, tenant: &Tenant, host: &str, port: u16) -> bool {
    shared.authority.is_some()
        && tenant.secrets.iter().any(|binding| {
            shared
                .store
                .get(Kind::Secret, &binding.secret)
                .and_then(|e| e.resource.as_secret()?.spec.injection().ok().flatten())
                .is_some_and(|injection| injection.applies_to(host, port))
        })
}

/// Serves one intercepted tunnel; records `decision` when it ends.
pub(super) async fn serve(
    shared: &Shared,
    tenant: &Tenant,
    client: TcpStream,
    upstream: TcpStream,
    host: &str,
    port: u16,
    mut decision: Decision,
) {
    let outcome = relay(shared, tenant, client, upstream, host, port).await;
    match outcome {
        Ok((out, back)) => {
            decision.bytes_out = out;
            decision.bytes_in = back;
        }
        Err(reason) => decision.rule = format!("{} (allowed; {reason})", decision.rule),
    }
    shared.record(&tenant.sandbox, decision);
}

async fn relay(
    shared: &Shared,
    tenant: &Tenant,
    client: TcpStream,
    upstream: TcpStream,
    host: &str,
    port: u16,
) -> Result<(u64, u64), String> {
    let authority = shared.authority.as_ref().ok_or("no authority")?;
    let server = authority.server_config(host).map_err(|e| e.to_string())?;
    let accept = tokio_rustls::TlsAcceptor::from(server).accept(client);
    let mut client = tokio::time::timeout(HEAD_TIMEOUT, accept)
        .await
        .map_err(|_| "the sandbox's TLS handshake was too slow".to_string())?
        .map_err(|e| format!("the sandbox's TLS handshake failed: {e}"))?;
    let head = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await;
    let (head, early) = match head {
        Ok(Ok(read)) => read,
        Ok(Err(reason)) => {
            reply(&mut client, "400 Bad Request", reason).await;
            return Err(reason.to_string());
        }
        Err(_) => {
            reply(&mut client, "408 Request Timeout", "request head too slow").await;
            return Err("request head too slow".into());
        }
    };
    let head = match origin_head(&head) {
        Ok(head) => head,
        Err(reason) => {
            reply(&mut client, "400 Bad Request", reason).await;
            return Err(reason.to_string());
        }
    };
    let (head, _) = inject(&shared.store, tenant, host, port, head).await;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("bad server name: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&authority.client_config()));
    let mut upstream = match connector.connect(name, upstream).await {
        Ok(upstream) => upstream,
        Err(error) => {
            let reason = format!("upstream TLS failed: {error}");
            reply(&mut client, "502 Bad Gateway", &reason).await;
            return Err(reason);
        }
    };
    send_then_splice(&mut client, &mut upstream, &head, &early).await
}

/// An origin-form request head made fit to send on: HTTP/1.x only, hop-by-hop and proxy
/// headers dropped, `Connection: close`.
pub(super) fn origin_head(head: &[u8]) -> Result<Vec<u8>, &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let parts: Vec<&str> = request_line.split(' ').collect();
    let [_, target, version] = parts[..] else {
        return Err("malformed request line");
    };
    if !version.starts_with("HTTP/1.") {
        return Err("only HTTP/1.x is served");
    }
    if !target.starts_with('/') && target != "*" {
        return Err("an origin-form target (/path) is expected");
    }
    let mut out = format!("{request_line}\r\n");
    end_to_end_headers(lines, &mut out);
    Ok(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intercepted_heads_are_origin_form_and_closed() {
        let head = b"POST /v1/x HTTP/1.1\r\nHost: a.example\r\nConnection: keep-alive\r\nAuthorization: Bearer p\r\n\r\n";
        assert_eq!(
            String::from_utf8(origin_head(head).unwrap()).unwrap(),
            "POST /v1/x HTTP/1.1\r\nHost: a.example\r\nAuthorization: Bearer p\r\nConnection: close\r\n\r\n"
        );
        for bad in [
            &b"GET http://a/ HTTP/1.1\r\n\r\n"[..],
            b"PRI * HTTP/2.0\r\n\r\n",
            b"GET /\r\n\r\n",
        ] {
            assert!(
                origin_head(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
