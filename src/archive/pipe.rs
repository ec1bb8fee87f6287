//! Bridges between async byte streams and the blocking tar code: the tar crate is synchronous, so
//! it runs on a blocking thread and exchanges chunks with the async side over bounded channels
//! (backpressure, never a whole archive in memory).

use std::io::{self, Read, Write};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::policy::ArchiveError;

/// Reads chunks sent by an async task. A sender that hangs up ends the data; an `Err` chunk is a
/// read error (the producer's own failure, e.g. Docker's stream broke).
pub struct ChannelReader {
    rx: mpsc::Receiver<Result<Bytes, String>>,
    current: Bytes,
}

impl ChannelReader {
    /// A reader and the sender the async side feeds; `depth` chunks may be in flight.
    pub fn new(depth: usize) -> (mpsc::Sender<Result<Bytes, String>>, ChannelReader) {
        let (tx, rx) = mpsc::channel(depth);
        (
            tx,
            ChannelReader {
                rx,
                current: Bytes::new(),
            },
        )
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(message)) => return Err(ArchiveError::Read(message).into_io()),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Sends what is written, in chunks of about `CHUNK` bytes, to an async consumer.
pub struct ChannelWriter {
    tx: mpsc::Sender<Bytes>,
    buffer: Vec<u8>,
}

const CHUNK: usize = 64 * 1024;

impl ChannelWriter {
    pub fn new(depth: usize) -> (ChannelWriter, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(depth);
        (
            ChannelWriter {
                tx,
                buffer: Vec::with_capacity(CHUNK),
            },
            rx,
        )
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buffer,
            Vec::with_capacity(CHUNK),
        ));
        self.tx.blocking_send(chunk).map_err(|_| {
            ArchiveError::Write("the consumer of the archive stopped reading".into()).into_io()
        })
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = CHUNK - self.buffer.len();
        let n = buf.len().min(room);
        self.buffer.extend_from_slice(&buf[..n]);
        if self.buffer.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}
