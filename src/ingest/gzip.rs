//! gzip input as gzip(1) reads it: every member in turn, and whatever follows the last one
//! that is not another member (padding, garbage a tool appended) is ignored, not an error.
//! flate2's `MultiGzDecoder` takes such bytes for a broken header and fails the whole file.

use std::io::{self, BufRead, Read};

use flate2::bufread::GzDecoder;

pub(super) struct GzipMembers<R: BufRead> {
    current: Option<GzDecoder<R>>,
}

impl<R: BufRead> GzipMembers<R> {
    pub(super) fn new(inner: R) -> Self {
        GzipMembers { current: Some(GzDecoder::new(inner)) }
    }
}

impl<R: BufRead> Read for GzipMembers<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(d) = self.current.as_mut() else { return Ok(0) };
            let n = d.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This member has ended: another follows only where a gzip header does.
            let mut inner = self.current.take().map(GzDecoder::into_inner).expect("a member");
            if inner.fill_buf()?.starts_with(&[0x1f, 0x8b]) {
                self.current = Some(GzDecoder::new(inner));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn read_all(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        GzipMembers::new(io::BufReader::new(bytes)).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn members_are_read_in_turn_and_trailing_garbage_is_ignored() {
        let mut two = gz(b"hello ");
        two.extend(gz(b"world"));
        assert_eq!(read_all(&two).unwrap(), b"hello world");
        let mut trailing = gz(b"hello");
        trailing.extend(b"garbage\0\0\0");
        assert_eq!(read_all(&trailing).unwrap(), b"hello");
    }

    #[test]
    fn a_truncated_member_is_still_an_error() {
        let whole = gz(b"hello world, a longer text to cut");
        assert!(read_all(&whole[..whole.len() - 6]).is_err());
    }
}
