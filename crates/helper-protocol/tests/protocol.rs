//! Round trips, rejections and boundary cases of the wire format, through the crate's public API.

use helper_protocol::*;

fn sample_start() -> StartRequest {
    StartRequest {
        id: 0x0102_0304_0506_0708,
        argv: vec!["/bin/sh".into(), "-c".into(), "echo héllo; exit 3".into()],
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("EMPTY".into(), String::new()),
        ],
        workdir: "/workspace".into(),
        timeout_ms: 60_000,
        linger_ms: DOCKER_LINGER_MS,
        keep_background: true,
    }
}

fn all_requests() -> Vec<Request> {
    vec![
        Request::Start(sample_start()),
        Request::Start(StartRequest::default()),
        Request::Kill { id: u64::MAX },
        Request::Shutdown,
        Request::WriteFile {
            id: 9,
            path: "/workspace/é.txt".into(),
            mode: 0o644,
        },
        Request::Data {
            id: 9,
            data: vec![0, 1, 0xff],
        },
        Request::Data {
            id: 9,
            data: Vec::new(),
        },
        Request::End { id: 9 },
    ]
}

fn all_events() -> Vec<Event> {
    vec![
        Event::Hello {
            version: PROTOCOL_VERSION,
        },
        Event::Started { id: 7, pid: 4242 },
        Event::Stdout {
            id: 7,
            data: b"out\n".to_vec(),
        },
        Event::Stderr {
            id: 7,
            data: vec![0xff, 0x00, 0xfe],
        },
        Event::Stdout {
            id: 8,
            data: Vec::new(),
        },
        Event::Stdout {
            id: 9,
            data: vec![b'x'; MAX_CHUNK_LEN],
        },
        Event::Exit {
            id: 7,
            exit_code: -1,
            timed_out: true,
            duration_ms: 12345,
        },
        Event::Exit {
            id: 7,
            exit_code: 137,
            timed_out: false,
            duration_ms: 0,
        },
        Event::Failed {
            id: 7,
            message: "nosuch: command not found".into(),
        },
        Event::Error {
            message: "bad frame".into(),
        },
    ]
}

fn encode_requests(reqs: &[Request]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in reqs {
        r.encode(&mut out).unwrap();
    }
    out
}

fn encode_events(evs: &[Event]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in evs {
        e.encode(&mut out).unwrap();
    }
    out
}

fn drain_requests(d: &mut FrameDecoder) -> Result<Vec<Request>, ProtocolError> {
    let mut v = Vec::new();
    while let Some(r) = d.next_request()? {
        v.push(r);
    }
    Ok(v)
}

fn drain_events(d: &mut FrameDecoder) -> Result<Vec<Event>, ProtocolError> {
    let mut v = Vec::new();
    while let Some(e) = d.next_event()? {
        v.push(e);
    }
    Ok(v)
}

#[test]
fn request_roundtrip() {
    let reqs = all_requests();
    let bytes = encode_requests(&reqs);
    let mut d = FrameDecoder::new();
    d.feed(&bytes);
    assert_eq!(drain_requests(&mut d).unwrap(), reqs);
    assert_eq!(d.buffered(), 0);
    d.finish().unwrap();
}

#[test]
fn event_roundtrip() {
    let evs = all_events();
    let bytes = encode_events(&evs);
    let mut d = FrameDecoder::new();
    d.feed(&bytes);
    assert_eq!(drain_events(&mut d).unwrap(), evs);
    d.finish().unwrap();
}

#[test]
fn roundtrip_byte_by_byte_and_in_odd_chunks() {
    let evs = all_events();
    let bytes = encode_events(&evs);
    for chunk in [1usize, 2, 3, 5, 7, 4096, 70_000] {
        let mut d = FrameDecoder::new();
        let mut got = Vec::new();
        for piece in bytes.chunks(chunk) {
            d.feed(piece);
            got.extend(drain_events(&mut d).unwrap());
        }
        assert_eq!(got, evs, "chunk size {chunk}");
        d.finish().unwrap();
    }
    let reqs = all_requests();
    let bytes = encode_requests(&reqs);
    let mut d = FrameDecoder::new();
    let mut got = Vec::new();
    for b in &bytes {
        d.feed(std::slice::from_ref(b));
        got.extend(drain_requests(&mut d).unwrap());
    }
    assert_eq!(got, reqs);
}

#[test]
fn frame_layout_is_documented_one() {
    let f = Request::Kill { id: 5 }.to_frame().unwrap();
    assert_eq!(f, [0, 0, 0, 9, kind::KILL, 0, 0, 0, 0, 0, 0, 0, 5]);
    let f = Request::Shutdown.to_frame().unwrap();
    assert_eq!(f, [0, 0, 0, 1, kind::SHUTDOWN]);
    let f = Event::Stdout {
        id: 1,
        data: b"hi".to_vec(),
    }
    .to_frame()
    .unwrap();
    assert_eq!(
        f,
        [
            0,
            0,
            0,
            11,
            kind::STDOUT,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            1,
            b'h',
            b'i'
        ]
    );
    let f = Event::Exit {
        id: 2,
        exit_code: -2,
        timed_out: true,
        duration_ms: 3,
    }
    .to_frame()
    .unwrap();
    assert_eq!(
        f,
        [
            0,
            0,
            0,
            22,
            kind::EXIT,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            2,
            0xff,
            0xff,
            0xff,
            0xfe,
            1,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            3
        ]
    );
}

#[test]
fn encode_output_matches_event_encoding() {
    let mut a = Vec::new();
    encode_output(&mut a, 9, true, b"abc").unwrap();
    assert_eq!(
        a,
        Event::Stderr {
            id: 9,
            data: b"abc".to_vec()
        }
        .to_frame()
        .unwrap()
    );
    let mut b = vec![1, 2, 3];
    assert!(encode_output(&mut b, 9, false, &vec![0; MAX_CHUNK_LEN + 1]).is_err());
    assert_eq!(b, [1, 2, 3], "failed encode leaves the buffer unchanged");
}

#[test]
fn oversized_frames_are_refused_by_encoder() {
    let big = "x".repeat(MAX_FRAME_LEN);
    let mut out = vec![42];
    let r = Request::Start(StartRequest {
        argv: vec![big.clone()],
        ..Default::default()
    });
    assert!(matches!(
        r.encode(&mut out),
        Err(ProtocolError::FrameTooLarge { .. })
    ));
    assert_eq!(out, [42]);
    let r = Request::Start(StartRequest {
        env: (0..20)
            .map(|i| (format!("K{i}"), "v".repeat(60_000)))
            .collect(),
        ..Default::default()
    });
    assert!(matches!(
        r.encode(&mut out),
        Err(ProtocolError::FrameTooLarge { .. })
    ));
    assert!(Event::Failed {
        id: 1,
        message: big
    }
    .to_frame()
    .is_err());
    // Just under the limit is fine.
    let fits = "y".repeat(MAX_FRAME_LEN - 1 - 8 - 4);
    let f = Event::Failed {
        id: 1,
        message: fits.clone(),
    }
    .to_frame()
    .unwrap();
    assert_eq!(f.len(), LEN_PREFIX + MAX_FRAME_LEN);
    let mut d = FrameDecoder::new();
    d.feed(&f);
    assert_eq!(
        d.next_event().unwrap(),
        Some(Event::Failed {
            id: 1,
            message: fits
        })
    );
}

#[test]
fn oversized_length_prefix_is_rejected_before_buffering() {
    let mut d = FrameDecoder::new();
    d.feed(&((MAX_FRAME_LEN + 1) as u32).to_be_bytes());
    assert_eq!(
        d.next_request(),
        Err(ProtocolError::FrameTooLarge {
            len: MAX_FRAME_LEN + 1
        })
    );
    // Stays failed, and does not buffer further input.
    d.feed(&[0u8; 1000]);
    assert_eq!(d.buffered(), 0);
    assert!(d.next_request().is_err());
    assert!(d.finish().is_err());

    let mut d = FrameDecoder::new();
    d.feed(&[0xff, 0xff, 0xff, 0xff]);
    assert!(matches!(
        d.next_event(),
        Err(ProtocolError::FrameTooLarge { .. })
    ));

    let mut d = FrameDecoder::new();
    d.feed(&[0, 0, 0, 0]);
    assert_eq!(d.next_event(), Err(ProtocolError::EmptyFrame));
}

#[test]
fn partial_frames_wait_for_more_and_eof_inside_frame_is_an_error() {
    let frame = Request::Start(sample_start()).to_frame().unwrap();
    for cut in 0..frame.len() {
        let mut d = FrameDecoder::new();
        d.feed(&frame[..cut]);
        assert_eq!(d.next_request(), Ok(None), "cut at {cut}");
        if cut == 0 {
            d.finish().unwrap();
        } else {
            assert_eq!(
                d.finish(),
                Err(ProtocolError::UnexpectedEof { buffered: cut })
            );
        }
        d.feed(&frame[cut..]);
        assert_eq!(d.next_request(), Ok(Some(Request::Start(sample_start()))));
    }
}

/// Rewrites the length prefix so that a shortened payload is a complete frame.
fn with_payload(kind_byte: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
    f.push(kind_byte);
    f.extend_from_slice(payload);
    f
}

#[test]
fn truncated_payloads_are_errors_for_every_message() {
    for r in all_requests() {
        let f = r.to_frame().unwrap();
        // Write data is "the rest of the payload" too: only cuts inside the id are errors.
        let min = match r {
            Request::Data { .. } => LEN_PREFIX + 1 + 8,
            _ => f.len(),
        };
        for cut in LEN_PREFIX + 1..min {
            let g = with_payload(f[LEN_PREFIX], &f[LEN_PREFIX + 1..cut]);
            let mut d = FrameDecoder::new();
            d.feed(&g);
            assert!(d.next_request().is_err(), "{r:?} cut at {cut} decoded");
        }
    }
    for e in all_events() {
        let f = e.to_frame().unwrap();
        // Output chunks are "the rest of the payload": only cuts inside the id are errors.
        let min = match e {
            Event::Stdout { .. } | Event::Stderr { .. } => LEN_PREFIX + 1 + 8,
            _ => f.len(),
        };
        for cut in LEN_PREFIX + 1..min {
            let g = with_payload(f[LEN_PREFIX], &f[LEN_PREFIX + 1..cut]);
            let mut d = FrameDecoder::new();
            d.feed(&g);
            assert!(d.next_event().is_err(), "{e:?} cut at {cut} decoded");
        }
    }
}

#[test]
fn trailing_bytes_are_errors() {
    for r in all_requests() {
        if matches!(r, Request::Data { .. }) {
            continue;
        }
        let f = r.to_frame().unwrap();
        let mut payload = f[LEN_PREFIX + 1..].to_vec();
        payload.push(0);
        let mut d = FrameDecoder::new();
        d.feed(&with_payload(f[LEN_PREFIX], &payload));
        assert_eq!(d.next_request(), Err(ProtocolError::TrailingBytes), "{r:?}");
    }
    let f = Event::Hello { version: 1 }.to_frame().unwrap();
    let mut payload = f[LEN_PREFIX + 1..].to_vec();
    payload.push(0);
    let mut d = FrameDecoder::new();
    d.feed(&with_payload(kind::HELLO, &payload));
    assert_eq!(d.next_event(), Err(ProtocolError::TrailingBytes));
}

#[test]
fn wrong_direction_and_unknown_kinds_are_rejected() {
    let mut d = FrameDecoder::new();
    d.feed(&Event::Hello { version: 1 }.to_frame().unwrap());
    assert_eq!(
        d.next_request(),
        Err(ProtocolError::UnknownKind(kind::HELLO))
    );
    let mut d = FrameDecoder::new();
    d.feed(&Request::Shutdown.to_frame().unwrap());
    assert_eq!(
        d.next_event(),
        Err(ProtocolError::UnknownKind(kind::SHUTDOWN))
    );
    for k in [0u8, 0x07, 0x7f, 0x80, 0x88, 0xff] {
        let mut d = FrameDecoder::new();
        d.feed(&with_payload(k, &[]));
        assert!(d.next_request().is_err());
        let mut d = FrameDecoder::new();
        d.feed(&with_payload(k, &[]));
        assert!(d.next_event().is_err());
    }
}

#[test]
fn invalid_field_values_are_rejected() {
    // bool other than 0/1
    let f = Event::Exit {
        id: 1,
        exit_code: 0,
        timed_out: false,
        duration_ms: 0,
    }
    .to_frame()
    .unwrap();
    let mut bad = f.clone();
    bad[LEN_PREFIX + 1 + 8 + 4] = 2;
    let mut d = FrameDecoder::new();
    d.feed(&bad);
    assert!(matches!(
        d.next_event(),
        Err(ProtocolError::InvalidValue(_))
    ));

    // invalid UTF-8 in a string
    let mut payload = 1u64.to_be_bytes().to_vec();
    payload.extend_from_slice(&2u32.to_be_bytes());
    payload.extend_from_slice(&[0xc3, 0x28]);
    let mut d = FrameDecoder::new();
    d.feed(&with_payload(kind::FAILED, &payload));
    assert_eq!(d.next_event(), Err(ProtocolError::InvalidUtf8));

    // string length pointing past the payload
    let mut payload = 1u64.to_be_bytes().to_vec();
    payload.extend_from_slice(&u32::MAX.to_be_bytes());
    payload.extend_from_slice(b"abc");
    let mut d = FrameDecoder::new();
    d.feed(&with_payload(kind::FAILED, &payload));
    assert_eq!(d.next_event(), Err(ProtocolError::Truncated));

    // huge list count with a tiny payload: rejected without allocating
    let mut payload = Vec::new();
    for _ in 0..3 {
        payload.extend_from_slice(&0u64.to_be_bytes());
    }
    payload.push(0);
    payload.extend_from_slice(&0u32.to_be_bytes()); // workdir ""
    payload.extend_from_slice(&u32::MAX.to_be_bytes()); // argv count
    let mut d = FrameDecoder::new();
    d.feed(&with_payload(kind::START, &payload));
    assert_eq!(d.next_request(), Err(ProtocolError::Truncated));

    // an output chunk above MAX_CHUNK_LEN
    let mut payload = 1u64.to_be_bytes().to_vec();
    payload.extend_from_slice(&vec![0u8; MAX_CHUNK_LEN + 1]);
    let mut d = FrameDecoder::new();
    d.feed(&with_payload(kind::STDOUT, &payload));
    assert!(matches!(
        d.next_event(),
        Err(ProtocolError::InvalidValue(_))
    ));
}

#[test]
fn frames_before_an_error_are_still_returned() {
    let mut bytes = Request::Kill { id: 1 }.to_frame().unwrap();
    bytes.extend_from_slice(&[0, 0, 0, 2, 0x55, 0x55]);
    bytes.extend_from_slice(&Request::Shutdown.to_frame().unwrap());
    let mut d = FrameDecoder::new();
    d.feed(&bytes);
    assert_eq!(d.next_request(), Ok(Some(Request::Kill { id: 1 })));
    assert_eq!(d.next_request(), Err(ProtocolError::UnknownKind(0x55)));
    assert_eq!(d.next_request(), Err(ProtocolError::UnknownKind(0x55)));
    assert!(d.error().is_some());
}

/// Small deterministic PRNG (xorshift) so the fuzz test needs no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn garbage_never_panics() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let valid = [
        encode_requests(&all_requests()),
        encode_events(&all_events()),
    ]
    .concat();
    for round in 0..3000 {
        let mut bytes: Vec<u8> = if round % 2 == 0 {
            let n = (rng.next() % 300) as usize;
            (0..n).map(|_| rng.next() as u8).collect()
        } else {
            // Valid frames with a few bytes flipped: exercises deep decoding paths.
            let mut v = valid.clone();
            for _ in 0..1 + rng.next() % 4 {
                let i = (rng.next() as usize) % v.len();
                v[i] = rng.next() as u8;
            }
            v
        };
        if round % 3 == 0 {
            // Small plausible length prefix so garbage reaches the payload decoders.
            let len = (rng.next() % 64) as u32;
            bytes.splice(0..0, len.to_be_bytes());
        }
        let mut d = FrameDecoder::new();
        let mut e = FrameDecoder::new();
        for piece in bytes.chunks(1 + (rng.next() % 17) as usize) {
            d.feed(piece);
            e.feed(piece);
            while let Ok(Some(_)) = d.next_request() {}
            while let Ok(Some(_)) = e.next_event() {}
        }
        let _ = d.finish();
        let _ = e.finish();
    }
}

#[test]
fn event_ids() {
    assert_eq!(Event::Hello { version: 1 }.id(), None);
    assert_eq!(
        Event::Stdout {
            id: 3,
            data: vec![]
        }
        .id(),
        Some(3)
    );
    assert_eq!(
        Event::Exit {
            id: 4,
            exit_code: 0,
            timed_out: false,
            duration_ms: 0
        }
        .id(),
        Some(4)
    );
}

#[test]
fn errors_display() {
    for e in [
        ProtocolError::FrameTooLarge { len: 5 },
        ProtocolError::EmptyFrame,
        ProtocolError::UnknownKind(9),
        ProtocolError::Truncated,
        ProtocolError::TrailingBytes,
        ProtocolError::InvalidUtf8,
        ProtocolError::InvalidValue("x"),
        ProtocolError::UnexpectedEof { buffered: 3 },
    ] {
        assert!(!e.to_string().is_empty());
    }
}
