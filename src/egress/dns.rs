//! The gateway's name server: a minimal DNS codec (one question, A and AAAA answered; anything
//! else refused without a lookup) and the UDP and TCP listeners policed sandboxes use. It decides
//! nothing itself: the gateway says which names resolve and to what. A denied name gets NXDOMAIN
//! and its query goes nowhere: nothing is forwarded on a sandbox's behalf.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

use super::gateway::Shared;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_FORMERR: u8 = 1;
const RCODE_NXDOMAIN: u8 = 3;
const RCODE_NOTIMP: u8 = 4;
/// How long answers may be cached (the gateway keeps its own lookups as long).
const ANSWER_TTL: u32 = super::resolve::ANSWER_LIFETIME.as_secs() as u32;
/// A TCP client gets this long for its whole query.
const TCP_QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// One parsed question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    pub id: u16,
    /// Recursion desired, echoed in the answer.
    pub recursion: bool,
    /// Lowercase, without the trailing dot.
    pub name: String,
    pub qtype: u16,
    /// The question section as received, echoed in the answer.
    raw_question: Vec<u8>,
}

impl Question {
    /// Whether the question asks for addresses (A or AAAA in class IN).
    pub fn wants_addresses(&self) -> bool {
        matches!(self.qtype, TYPE_A | TYPE_AAAA)
    }
}

/// Why a message is not a question this server answers.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Too short to carry an ID: nothing can be answered.
    Unanswerable,
    /// Has an ID, but is not one well-formed standard query: answered with this code.
    Refused { id: u16, rcode: u8 },
}

/// Parses a query: one question, standard opcode, no compression in the question name.
pub fn parse(message: &[u8]) -> Result<Question, ParseError> {
    if message.len() < 12 {
        return Err(ParseError::Unanswerable);
    }
    let id = u16::from_be_bytes([message[0], message[1]]);
    let formerr = ParseError::Refused {
        id,
        rcode: RCODE_FORMERR,
    };
    let flags = message[2];
    if flags & 0x80 != 0 {
        // A response: never answered (no reflection loops).
        return Err(ParseError::Unanswerable);
    }
    let opcode = (flags >> 3) & 0x0f;
    if opcode != 0 {
        return Err(ParseError::Refused {
            id,
            rcode: RCODE_NOTIMP,
        });
    }
    let questions = u16::from_be_bytes([message[4], message[5]]);
    if questions != 1 {
        return Err(formerr);
    }
    let mut at = 12;
    let mut labels: Vec<String> = Vec::new();
    let mut length = 0usize;
    loop {
        let Some(&len) = message.get(at) else {
            return Err(formerr);
        };
        at += 1;
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 {
            // Compression pointers or extended labels have no place in a question.
            return Err(formerr);
        }
        let len = usize::from(len);
        let Some(label) = message.get(at..at + len) else {
            return Err(formerr);
        };
        length += len + 1;
        if length > 255 {
            return Err(formerr);
        }
        if !label
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        {
            return Err(formerr);
        }
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += len;
    }
    let Some(tail) = message.get(at..at + 4) else {
        return Err(formerr);
    };
    let qtype = u16::from_be_bytes([tail[0], tail[1]]);
    let qclass = u16::from_be_bytes([tail[2], tail[3]]);
    if qclass != CLASS_IN {
        return Err(ParseError::Refused {
            id,
            rcode: RCODE_NOTIMP,
        });
    }
    Ok(Question {
        id,
        recursion: flags & 0x01 != 0,
        name: labels.join("."),
        qtype,
        raw_question: message[12..at + 4].to_vec(),
    })
}

/// An answer to `question`: the addresses of its type among `addresses`, or an error code.
pub fn answer(question: &Question, rcode: u8, addresses: &[IpAddr]) -> Vec<u8> {
    let records: Vec<&IpAddr> = addresses
        .iter()
        .filter(|a| match question.qtype {
            TYPE_A => a.is_ipv4(),
            TYPE_AAAA => a.is_ipv6(),
            _ => false,
        })
        .take(16)
        .collect();
    let records = if rcode == 0 { records } else { Vec::new() };
    let mut out = Vec::with_capacity(12 + question.raw_question.len() + records.len() * 28);
    out.extend_from_slice(&question.id.to_be_bytes());
    // QR, opcode 0, AA off, RD echoed; RA set.
    out.push(0x80 | u8::from(question.recursion));
    out.push(0x80 | rcode);
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&question.raw_question);
    for address in records {
        out.extend_from_slice(&[0xc0, 0x0c]);
        out.extend_from_slice(&question.qtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ANSWER_TTL.to_be_bytes());
        match address {
            IpAddr::V4(v4) => {
                out.extend_from_slice(&4u16.to_be_bytes());
                out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out.extend_from_slice(&16u16.to_be_bytes());
                out.extend_from_slice(&v6.octets());
            }
        }
    }
    out
}

/// A bare error answer to a message whose question could not be read.
fn error_answer(id: u16, rcode: u8) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(&[0x80, 0x80 | rcode, 0, 0, 0, 0, 0, 0, 0, 0]);
    out
}

/// What the server sends back for `message` from `source`, if anything.
async fn respond(shared: &Shared, source: IpAddr, message: &[u8]) -> Option<Vec<u8>> {
    let question = match parse(message) {
        Ok(question) => question,
        Err(ParseError::Unanswerable) => return None,
        Err(ParseError::Refused { id, rcode }) => return Some(error_answer(id, rcode)),
    };
    if !question.wants_addresses() {
        return Some(answer(&question, RCODE_NOTIMP, &[]));
    }
    match shared.lookup(source, &question.name).await {
        Some(addresses) => Some(answer(&question, 0, &addresses)),
        None => Some(answer(&question, RCODE_NXDOMAIN, &[])),
    }
}

/// Serves DNS over UDP on `socket` until the task is aborted.
pub(super) async fn serve_udp(shared: Arc<Shared>, socket: UdpSocket) {
    let socket = Arc::new(socket);
    let mut buffer = vec![0u8; 1500];
    loop {
        let (len, peer) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%error, "egress dns: receive failed");
                continue;
            }
        };
        // A sandbox past its query rate is not answered (nor is any lookup made for it).
        if !shared.bounds.query(peer.ip()) {
            continue;
        }
        let message = buffer[..len].to_vec();
        let (shared, socket) = (Arc::clone(&shared), Arc::clone(&socket));
        tokio::spawn(async move {
            if let Some(reply) = respond(&shared, peer.ip(), &message).await {
                let _ = socket.send_to(&reply, peer).await;
            }
        });
    }
}

/// Serves DNS over TCP (one length-prefixed query per message) until the task is aborted.
pub(super) async fn serve_tcp(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(TCP_QUERY_TIMEOUT, serve_tcp_client(&shared, stream, peer))
                    .await;
        });
    }
}

async fn serve_tcp_client(
    shared: &Shared,
    mut stream: tokio::net::TcpStream,
    peer: SocketAddr,
) -> std::io::Result<()> {
    // Connections count against the sandbox's cap, queries against its rate, as over UDP.
    let Some(_slot) = shared.bounds.connection(peer.ip()) else {
        return Ok(());
    };
    let length = usize::from(stream.read_u16().await?);
    let mut message = vec![0u8; length];
    stream.read_exact(&mut message).await?;
    if !shared.bounds.query(peer.ip()) {
        return Ok(());
    }
    if let Some(reply) = respond(shared, peer.ip(), &message).await {
        let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&reply);
        stream.write_all(&framed).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
        let mut out = id.to_be_bytes().to_vec();
        out.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        for label in name.split('.') {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out.extend_from_slice(&qtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out
    }

    #[test]
    fn a_query_is_read_and_answered() {
        let q = parse(&query(0x1234, "Files.Example.COM", TYPE_A)).unwrap();
        assert_eq!(q.name, "files.example.com");
        assert!(q.wants_addresses() && q.recursion);
        let addresses: Vec<IpAddr> = vec![
            "203.0.113.7".parse().unwrap(),
            "2001:db8::1".parse().unwrap(),
        ];
        let reply = answer(&q, 0, &addresses);
        assert_eq!(&reply[..2], &[0x12, 0x34]);
        assert_eq!(reply[3] & 0x0f, 0);
        assert_eq!(u16::from_be_bytes([reply[6], reply[7]]), 1, "one A record");
        assert_eq!(&reply[reply.len() - 4..], &[203, 0, 113, 7]);

        let q6 = parse(&query(7, "example.com", TYPE_AAAA)).unwrap();
        let reply = answer(&q6, 0, &addresses);
        assert_eq!(
            u16::from_be_bytes([reply[6], reply[7]]),
            1,
            "one AAAA record"
        );
        let nx = answer(&q6, RCODE_NXDOMAIN, &addresses);
        assert_eq!(nx[3] & 0x0f, RCODE_NXDOMAIN);
        assert_eq!(
            u16::from_be_bytes([nx[6], nx[7]]),
            0,
            "no records with an error"
        );
    }

    #[test]
    fn hostile_messages_are_refused_without_panicking() {
        assert_eq!(parse(&[]), Err(ParseError::Unanswerable));
        assert_eq!(parse(&[1, 2, 3]), Err(ParseError::Unanswerable));
        // A response is never answered.
        let mut response = query(1, "a.com", TYPE_A);
        response[2] |= 0x80;
        assert_eq!(parse(&response), Err(ParseError::Unanswerable));
        // Truncated anywhere: FORMERR, never a panic.
        let whole = query(9, "example.com", TYPE_A);
        for cut in 12..whole.len() {
            assert!(
                matches!(parse(&whole[..cut]), Err(ParseError::Refused { id: 9, .. })),
                "cut at {cut}"
            );
        }
        // A compression pointer in the question, two questions, a label of bad bytes.
        let mut pointer = query(2, "a.com", TYPE_A);
        pointer[12] = 0xc0;
        assert!(matches!(
            parse(&pointer),
            Err(ParseError::Refused {
                rcode: RCODE_FORMERR,
                ..
            })
        ));
        let mut two = query(3, "a.com", TYPE_A);
        two[5] = 2;
        assert!(parse(&two).is_err());
        let mut bad = query(4, "a.com", TYPE_A);
        bad[13] = b'/';
        assert!(parse(&bad).is_err());
        // A name longer than 255 octets.
        let long = vec!["a".repeat(63); 5].join(".");
        assert!(parse(&query(5, &long, TYPE_A)).is_err());
        // Another opcode, another class.
        let mut status = query(6, "a.com", TYPE_A);
        status[2] = 0x10;
        assert_eq!(
            parse(&status),
            Err(ParseError::Refused {
                id: 6,
                rcode: RCODE_NOTIMP
            })
        );
        let mut chaos = query(8, "a.com", TYPE_A);
        let n = chaos.len();
        chaos[n - 1] = 3;
        assert_eq!(
            parse(&chaos),
            Err(ParseError::Refused {
                id: 8,
                rcode: RCODE_NOTIMP
            })
        );
        // Other types parse but are not address questions.
        assert!(!parse(&query(10, "a.com", 16)).unwrap().wants_addresses());
    }
}
