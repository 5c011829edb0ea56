//! Interned strings: each content stored once, by id; the short strings a trace repeats in
//! every entry found again through a small cache before the hash.

use foldhash::HashMap;

use super::StrId;

/// Interned string content.
#[derive(Debug, Default, Clone)]
pub struct Strings {
    pub(super) text: String,
    pub(super) spans: Vec<(u32, u32)>,
    pub(super) index: HashMap<Box<str>, StrId>,
    /// Short strings seen last, by a cheap slot: torch writes a fresh `'N/A'` per trace entry.
    pub(super) recent: Vec<(StrId, u8, [u8; 15])>,
}

impl Strings {
    /// The id of UTF-8 (or lossily decoded) `bytes`, adding it if new. `None` past `max_bytes`.
    pub fn intern_bytes(&mut self, bytes: &[u8], max_bytes: u64) -> Option<StrId> {
        if bytes.len() < 15 {
            if self.recent.is_empty() {
                self.recent = vec![(StrId::MAX, 0, [0; 15]); 64];
            }
            let slot = (bytes.len() ^ bytes.first().map_or(0, |&b| b as usize * 7)) & 63;
            let (id, len, ref text) = self.recent[slot];
            if id != StrId::MAX && len as usize == bytes.len() && &text[..bytes.len()] == bytes {
                return Some(id);
            }
            let id = self.intern(&String::from_utf8_lossy(bytes), max_bytes)?;
            let mut text = [0u8; 15];
            text[..bytes.len()].copy_from_slice(bytes);
            // Only valid UTF-8 is cached: a lossy decoding is not the same bytes.
            if std::str::from_utf8(bytes).is_ok() {
                self.recent[slot] = (id, bytes.len() as u8, text);
            }
            return Some(id);
        }
        self.intern(&String::from_utf8_lossy(bytes), max_bytes)
    }

    /// The id of `s`, adding it if new. `None` if the table would pass `max_bytes`.
    pub fn intern(&mut self, s: &str, max_bytes: u64) -> Option<StrId> {
        if let Some(&id) = self.index.get(s) {
            return Some(id);
        }
        if (self.text.len() + s.len()) as u64 > max_bytes || self.text.len() + s.len() > u32::MAX as usize {
            return None;
        }
        let id = self.spans.len() as StrId;
        self.spans.push((self.text.len() as u32, s.len() as u32));
        self.text.push_str(s);
        self.index.insert(s.into(), id);
        Some(id)
    }

    /// The id of `s` if it was ever interned.
    pub fn find(&self, s: &str) -> Option<StrId> {
        self.index.get(s).copied()
    }

    /// True for the empty string (and unknown ids): a length check, no slicing.
    pub fn is_empty_at(&self, id: StrId) -> bool {
        self.spans.get(id as usize).is_none_or(|&(_, len)| len == 0)
    }

    pub fn get(&self, id: StrId) -> &str {
        match self.spans.get(id as usize) {
            Some(&(start, len)) => &self.text[start as usize..(start + len) as usize],
            None => "",
        }
    }

    /// About the bytes the interned strings hold: their text, spans and index.
    pub fn approx_bytes(&self) -> u64 {
        self.text.capacity() as u64 * 2 + self.spans.len() as u64 * 48
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}
