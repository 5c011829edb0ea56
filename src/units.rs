//! Formatting of sizes and addresses for people and for JSON.

use serde::{Serialize, Serializer};

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

/// An address, written in JSON as a hex string (`"0x7f3a..."`): JavaScript numbers lose
/// precision above 2^53.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr(pub u64);

impl Serialize for Addr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:#x}", self.0))
    }
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
    fn addresses_are_hex_strings() {
        assert_eq!(serde_json::to_string(&Addr(0x7f3a00)).unwrap(), "\"0x7f3a00\"");
    }
}
