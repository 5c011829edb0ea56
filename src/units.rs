//! Formatting of sizes and addresses for people and for JSON.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes as torch prints them: `3.05 GiB`, `520.00 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.2} {}", UNITS[unit]) }
}

/// Bytes exactly as torch's OOM message writes them (`format_size` in the allocator):
/// `1024.00 MiB` for 1 GiB, `0 bytes`, so a summary quotes the numbers the user saw.
pub fn torch_size(n: u64) -> String {
    let v = n as f64;
    if n <= 1024 {
        format!("{n} bytes")
    } else if n <= 1 << 20 {
        format!("{:.2} KiB", v / 1024.0)
    } else if n <= 1 << 30 {
        format!("{:.2} MiB", v / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", v / (1u64 << 30) as f64)
    }
}

/// An address, written in JSON as a hex string (`"0x7f3a..."`): JavaScript numbers lose
/// precision above 2^53.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr(pub u64);

impl Serialize for Addr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:#x}", self.0))
    }
}

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Addr, D::Error> {
        let s = String::deserialize(d)?;
        let hex = s.strip_prefix("0x").ok_or_else(|| serde::de::Error::custom("an address starts with 0x"))?;
        u64::from_str_radix(hex, 16).map(Addr).map_err(serde::de::Error::custom)
    }
}

/// Bytes (a digest) in lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_match_torch_style() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(545259520), "520.00 MiB");
        assert_eq!(bytes(3271557120), "3.05 GiB");
    }

    #[test]
    fn torch_sizes_match_the_oom_message() {
        assert_eq!(torch_size(0), "0 bytes");
        assert_eq!(torch_size(1 << 30), "1024.00 MiB");
        assert_eq!(torch_size(3271557120), "3.05 GiB");
        assert_eq!(torch_size(20 << 20), "20.00 MiB");
    }

    #[test]
    fn addresses_are_hex_strings() {
        assert_eq!(serde_json::to_string(&Addr(0x7f3a00)).unwrap(), "\"0x7f3a00\"");
    }
}
