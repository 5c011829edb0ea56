//! Decoding of operand forms that are not plain little-endian integers.

use super::value::Value;

/// A little-endian two's-complement integer of any length (LONG1, LONG4), if it fits i64 or u64.
pub fn le_int(raw: &[u8]) -> Option<Value> {
    if let Some(v) = le_signed(raw) {
        return Some(Value::Int(v));
    }
    // Non-negative and at most 9 bytes with a zero top byte: fits u64.
    match raw {
        [low @ .., 0] if low.len() <= 8 => {
            let mut bytes = [0u8; 8];
            bytes[..low.len()].copy_from_slice(low);
            Some(Value::UInt(u64::from_le_bytes(bytes)))
        }
        _ => None,
    }
}

/// A little-endian two's-complement integer of any length, if it fits i64.
pub fn le_signed(raw: &[u8]) -> Option<i64> {
    if raw.is_empty() {
        return Some(0);
    }
    let negative = raw[raw.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0x00 };
    let (low, high) = raw.split_at(raw.len().min(8));
    if high.iter().any(|&b| b != fill) {
        return None;
    }
    let mut bytes = [fill; 8];
    bytes[..low.len()].copy_from_slice(low);
    let v = i64::from_le_bytes(bytes);
    // 8 low bytes whose sign disagrees with the full number's: it needs 65 bits.
    if (v < 0) != negative {
        return None;
    }
    Some(v)
}

/// INT, LONG and FLOAT of protocols 0 and 1.
pub fn number(op: u8, line: &str) -> Option<Value> {
    match op {
        b'I' if line == "01" => Some(Value::Bool(true)),
        b'I' if line == "00" => Some(Value::Bool(false)),
        b'I' => line.parse().ok().map(Value::Int),
        b'L' => line.strip_suffix('L').unwrap_or(line).parse().ok().map(Value::Int),
        b'F' => line.parse().ok().map(Value::Float),
        _ => None,
    }
}

/// STRING ('quoted') and UNICODE (raw) of protocol 0, without escapes: snapshots never use them,
/// so anything with a backslash is refused rather than half-decoded.
pub fn plain_string(op: u8, line: &str) -> Option<String> {
    if line.contains('\\') {
        return None;
    }
    if op == b'V' {
        return Some(line.to_string());
    }
    let q = line.chars().next()?;
    if (q != '\'' && q != '"') || line.len() < 2 || !line.ends_with(q) {
        return None;
    }
    Some(line[1..line.len() - 1].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn le_signed_matches_python() {
        assert_eq!(le_signed(&[]), Some(0));
        assert_eq!(le_signed(&[0xff]), Some(-1));
        assert_eq!(le_signed(&[0x00, 0x80]), Some(-32768));
        // 2**63 - 1 and -2**63
        assert_eq!(le_signed(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]), Some(i64::MAX));
        assert_eq!(le_signed(&[0, 0, 0, 0, 0, 0, 0, 0x80]), Some(i64::MIN));
        // 2**63 needs nine bytes and does not fit
        assert_eq!(le_signed(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]), None);
        // a nine-byte encoding of a small number fits
        assert_eq!(le_signed(&[5, 0, 0, 0, 0, 0, 0, 0, 0]), Some(5));
    }

    #[test]
    fn le_int_takes_u64_like_torch_line_numbers() {
        // pickle.dumps(2**64 - 1): LONG1 with 9 bytes
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00];
        assert_eq!(le_int(&max), Some(Value::UInt(u64::MAX)));
        assert_eq!(le_int(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), None, "2**64 does not fit");
        assert_eq!(le_int(&[0xff]), Some(Value::Int(-1)));
    }
}
