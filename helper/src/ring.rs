//! A bounded byte ring addressed by absolute offsets: the retained tail of one output stream of a
//! supervised process. It grows only as output arrives, up to its capacity, then forgets the
//! oldest bytes; offsets keep counting every byte ever pushed. No I/O here.

use std::collections::VecDeque;

pub struct Ring {
    buf: VecDeque<u8>,
    cap: usize,
    /// Absolute offset of `buf[0]`.
    start: u64,
}

impl Ring {
    pub fn new(cap: usize) -> Ring {
        Ring {
            buf: VecDeque::new(),
            cap: cap.max(1),
            start: 0,
        }
    }

    /// Offset of the oldest byte still retained.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Offset just past the newest byte: how many bytes the stream has carried.
    pub fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    pub fn push(&mut self, data: &[u8]) {
        let data = if data.len() > self.cap {
            let skip = data.len() - self.cap;
            self.start += (self.buf.len() + skip) as u64;
            self.buf.clear();
            &data[skip..]
        } else {
            data
        };
        let over = (self.buf.len() + data.len()).saturating_sub(self.cap);
        if over > 0 {
            self.buf.drain(..over);
            self.start += over as u64;
        }
        self.buf.extend(data);
    }

    /// Up to `max` bytes from `from` (which must be within `start()..=end()`), as one contiguous
    /// slice (possibly shorter than what is available; call again).
    pub fn read(&self, from: u64, max: usize) -> &[u8] {
        if from < self.start || from >= self.end() {
            return &[];
        }
        let at = (from - self.start) as usize;
        let (a, b) = self.buf.as_slices();
        let s = if at < a.len() {
            &a[at..]
        } else {
            &b[at - a.len()..]
        };
        &s[..s.len().min(max)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(r: &Ring, mut from: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let s = r.read(from, 3);
            if s.is_empty() {
                return out;
            }
            out.extend_from_slice(s);
            from += s.len() as u64;
        }
    }

    #[test]
    fn keeps_the_tail_and_counts_every_byte() {
        let mut r = Ring::new(10);
        r.push(b"0123456");
        assert_eq!((r.start(), r.end()), (0, 7));
        r.push(b"789abc");
        assert_eq!((r.start(), r.end()), (3, 13));
        assert_eq!(collect(&r, 3), b"3456789abc");
        assert_eq!(collect(&r, 12), b"c");
        assert!(r.read(2, 5).is_empty());
        assert!(r.read(13, 5).is_empty());
        r.push(b"ABCDEFGHIJKLMNOP");
        assert_eq!((r.start(), r.end()), (19, 29));
        assert_eq!(collect(&r, 19), b"GHIJKLMNOP");
    }
}
