//! A buffered byte source that knows its offset and can never read out of bounds.
//!
//! Reads come from any `std::io::Read` (a file, a decompressor) through a 256 KiB buffer, so the
//! whole input is never held in memory. Every read returns `Truncated` at the end instead of
//! panicking, and every byte counts against `max_input_bytes`.

use std::io::Read;

use super::error::{ErrorKind, ReadError};

const BUF_BYTES: usize = 256 << 10;

pub struct Input<R> {
    inner: R,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// Offset of `buf[0]` in the input.
    base: u64,
    max_bytes: u64,
}

impl<R: Read> Input<R> {
    pub fn new(inner: R, max_bytes: u64) -> Self {
        Self::starting_at(inner, 0, max_bytes)
    }

    /// An input whose first byte is byte `offset` of the whole (a part read apart).
    pub fn starting_at(inner: R, offset: u64, max_bytes: u64) -> Self {
        Input { inner, buf: vec![0; BUF_BYTES].into_boxed_slice(), pos: 0, end: 0, base: offset, max_bytes }
    }

    /// Drops what is buffered: the next byte read is byte `offset` of the whole, which the
    /// reader underneath must now deliver (a part read apart was taken in up to there).
    pub fn reset(&mut self, offset: u64) {
        (self.base, self.pos, self.end) = (offset, 0, 0);
    }

    /// Refills until at least `n` bytes are buffered ahead (at most the buffer's size); false
    /// if the input ends first.
    pub fn ensure(&mut self, n: usize) -> Result<bool, ReadError> {
        while self.end - self.pos < n.min(BUF_BYTES) {
            if !self.fill()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The next byte without consuming it, refilling if need be; None at the end.
    pub fn peek_filled(&mut self) -> Result<Option<u8>, ReadError> {
        if self.pos == self.end && !self.fill()? {
            return Ok(None);
        }
        Ok(Some(self.buf[self.pos]))
    }

    /// Skips `n` bytes, refilling as it goes; `Truncated` at the end of the input.
    pub fn skip_bytes(&mut self, mut n: u64) -> Result<(), ReadError> {
        while n > 0 {
            if self.pos == self.end && !self.fill()? {
                return Err(self.error(ErrorKind::Truncated));
            }
            let k = n.min((self.end - self.pos) as u64) as usize;
            self.pos += k;
            n -= k as u64;
        }
        Ok(())
    }

    /// Offset of the next byte to be read.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    pub fn error(&self, kind: ErrorKind) -> ReadError {
        ReadError { kind, offset: self.offset() }
    }

    /// Refills the buffer; false at the end of the input.
    fn fill(&mut self) -> Result<bool, ReadError> {
        self.base += self.pos as u64;
        self.buf.copy_within(self.pos..self.end, 0);
        self.end -= self.pos;
        self.pos = 0;
        loop {
            if self.base + self.end as u64 >= self.max_bytes {
                return Err(ReadError {
                    kind: ErrorKind::Limit { what: "input size in bytes", limit: self.max_bytes },
                    offset: self.base + self.end as u64,
                });
            }
            let room = (self.max_bytes - self.base - self.end as u64).min((self.buf.len() - self.end) as u64);
            match self.inner.read(&mut self.buf[self.end..self.end + room as usize]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.error(ErrorKind::Io(e.to_string()))),
            }
        }
    }

    /// The next byte, or None at a clean end of input.
    #[inline(always)]
    pub fn next_byte(&mut self) -> Result<Option<u8>, ReadError> {
        if self.pos < self.end {
            let b = self.buf[self.pos];
            self.pos += 1;
            return Ok(Some(b));
        }
        self.next_byte_slow()
    }

    #[cold]
    #[inline(never)]
    fn next_byte_slow(&mut self) -> Result<Option<u8>, ReadError> {
        if self.pos == self.end && !self.fill()? {
            return Ok(None);
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(Some(b))
    }

    #[inline(always)]
    pub fn byte(&mut self) -> Result<u8, ReadError> {
        self.next_byte()?.ok_or_else(|| self.error(ErrorKind::Truncated))
    }

    /// Exactly N bytes.
    #[inline(always)]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        if self.end - self.pos >= N {
            let mut out = [0u8; N];
            out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
            self.pos += N;
            return Ok(out);
        }
        self.array_slow()
    }

    #[cold]
    #[inline(never)]
    fn array_slow<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        let mut out = [0u8; N];
        for slot in out.iter_mut() {
            *slot = self.byte()?;
        }
        Ok(out)
    }

    /// `n` bytes, borrowed from the buffer when they are in it, else gathered into `scratch`.
    /// The caller has already checked `n` against its limit; `scratch` grows only as bytes
    /// actually arrive, so a huge length claim on a short input costs nothing.
    pub fn take<'a>(&'a mut self, n: usize, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], ReadError> {
        if self.end - self.pos >= n {
            let start = self.pos;
            self.pos += n;
            return Ok(&self.buf[start..start + n]);
        }
        scratch.clear();
        while scratch.len() < n {
            if self.pos == self.end && !self.fill()? {
                return Err(self.error(ErrorKind::Truncated));
            }
            let k = (n - scratch.len()).min(self.end - self.pos);
            scratch.extend_from_slice(&self.buf[self.pos..self.pos + k]);
            self.pos += k;
        }
        Ok(scratch)
    }

    /// The next byte if the buffer holds it (no refill: callers fall back to the slow path).
    #[inline(always)]
    pub fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied().filter(|_| self.pos < self.end)
    }

    /// Skips `n` bytes that `peek` showed are buffered.
    #[inline(always)]
    pub fn skip(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }

    /// The next `n` (at most 8) bytes as a little-endian word, when 8 bytes are buffered:
    /// one load and a shift instead of a copy of variable length.
    #[inline(always)]
    pub fn take_le(&mut self, n: usize) -> Option<u64> {
        if n > 8 || self.end - self.pos < 8 {
            return None;
        }
        let word = u64::from_le_bytes(self.buf[self.pos..self.pos + 8].try_into().ok()?);
        self.pos += n;
        Some(if n == 0 { 0 } else { word << (64 - 8 * n) })
    }

    /// The bytes buffered ahead, for a fast path that parses them in place and then
    /// [`advance`](Self::advance)s past what it used (or nothing, when it falls back).
    #[inline(always)]
    pub fn window(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    /// Consumes `n` bytes of [`window`](Self::window).
    #[inline(always)]
    pub fn advance(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }

    /// A newline-terminated line (text opcodes of protocols 0 and 1), without the newline.
    pub fn line<'a>(&'a mut self, max: usize, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], ReadError> {
        scratch.clear();
        loop {
            let b = self.byte()?;
            if b == b'\n' {
                return Ok(scratch);
            }
            if scratch.len() >= max {
                return Err(self.error(ErrorKind::Limit { what: "text line length", limit: max as u64 }));
            }
            scratch.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_buffer_boundaries_and_reports_truncation() {
        let data: Vec<u8> = (0..(BUF_BYTES + 10)).map(|i| i as u8).collect();
        let mut input = Input::new(&data[..], u64::MAX);
        let mut scratch = Vec::new();
        let first = input.take(BUF_BYTES - 2, &mut scratch).unwrap().len();
        assert_eq!(first, BUF_BYTES - 2);
        let straddle = input.take(6, &mut scratch).unwrap().to_vec();
        assert_eq!(straddle, data[BUF_BYTES - 2..BUF_BYTES + 4]);
        assert_eq!(input.offset(), BUF_BYTES as u64 + 4);
        let err = input.take(100, &mut scratch).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Truncated);
    }

    #[test]
    fn input_size_limit_is_enforced() {
        let data = [0u8; 100];
        let mut input = Input::new(&data[..], 10);
        let mut scratch = Vec::new();
        let err = input.take(50, &mut scratch).unwrap_err();
        assert!(matches!(err.kind, ErrorKind::Limit { .. }), "{err}");
    }
}
