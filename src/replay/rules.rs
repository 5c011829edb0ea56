//! The caching allocator's rules that decide block sizes, from `c10/cuda/CUDACachingAllocator.cpp`.
//!
//! Replay needs them because the trace records requested bytes, not block sizes; the what-if
//! simulation reuses them to allocate.

/// Every block is a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK: u64 = 512;
/// Largest request served from the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for large requests under `MIN_LARGE_ALLOC` (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// `kMinLargeAlloc`.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Large segments are rounded to this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 << 20;
const MIB: u64 = 1 << 20;

/// The allocator settings that change where blocks land, as the snapshot records them.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    /// `max_split_size` in bytes; `u64::MAX` when unlimited (torch reports -1).
    pub max_split_size: u64,
    /// `expandable_segments:True`: segments grow by mapping pages.
    pub expandable_segments: bool,
    /// `roundup_power2_divisions` for the 16 power-of-two intervals from 1 MiB to 32 GiB.
    pub divisions: [u64; 16],
    /// `garbage_collection_threshold` (0 when off).
    pub gc_threshold: f64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { max_split_size: u64::MAX, expandable_segments: false, divisions: [0; 16], gc_threshold: 0.0 }
    }
}

impl Rules {
    /// Reads the snapshot's `allocator_settings` (absent before torch 2.3: defaults).
    pub fn from_settings(settings: Option<&serde_json::Value>) -> Rules {
        let mut rules = Rules::default();
        let Some(s) = settings else { return rules };
        if let Some(m) = s.get("max_split_size").and_then(|v| v.as_i64()) {
            rules.max_split_size = if m <= 0 { u64::MAX } else { m as u64 };
        }
        rules.expandable_segments = s.get("expandable_segments").and_then(|v| v.as_bool()).unwrap_or(false);
        rules.gc_threshold = s.get("garbage_collection_threshold").and_then(|v| v.as_f64()).unwrap_or(0.0);
        if let Some(d) = s.get("roundup_power2_divisions").and_then(|v| v.as_object()) {
            for (k, v) in d {
                // Keys are the interval's start in MiB: "1", "2", ..., "32768".
                if let (Ok(mib), Some(n)) = (k.parse::<u64>(), v.as_u64())
                    && mib.is_power_of_two()
                    && mib.trailing_zeros() < 16
                {
                    rules.divisions[mib.trailing_zeros() as usize] = n;
                }
            }
        }
        rules
    }

    /// `round_size`: the block size a request of `size` bytes asks for.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let divisions = self.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK * divisions {
            return roundup_power2_next_division(size, divisions);
        }
        size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }

    fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.leading_zeros() as i64;
        let index = (log - 20).clamp(0, 15) as usize;
        self.divisions[index]
    }

    /// `should_split`: whether a free block of `block_size` serving `size` (rounded) bytes keeps
    /// the rest as a separate free block, or hands out the whole block.
    pub fn should_split(&self, block_size: u64, size: u64, small_pool: bool, expandable: bool) -> bool {
        let remaining = block_size.saturating_sub(size);
        if small_pool || expandable || self.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// `get_allocation_size`: the cudaMalloc size of a new segment for a rounded request.
    pub fn segment_size(size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            size.div_ceil(ROUND_LARGE) * ROUND_LARGE
        }
    }

    /// Whether a request of this rounded size goes to the small pool.
    pub fn is_small(size: u64) -> bool {
        size <= SMALL_SIZE
    }

    /// `max_split_size_mb` as a user writes it, if set.
    pub fn max_split_size_mb(&self) -> Option<u64> {
        (self.max_split_size != u64::MAX).then_some(self.max_split_size / MIB)
    }
}

fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded = size & !(step - 1);
    if rounded == size { size } else { rounded + step }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_torch() {
        let r = Rules::default();
        assert_eq!(r.round_size(1), 512);
        assert_eq!(r.round_size(513), 1024);
        assert_eq!(r.round_size(545259520), 545259520);
        let four = Rules { divisions: [4; 16], ..Rules::default() };
        // 1200 MiB with 4 divisions of [1024, 2048) rounds up to 1280 MiB.
        assert_eq!(four.round_size(1200 * MIB), 1280 * MIB);
        assert_eq!(four.round_size(1024 * MIB), 1024 * MIB);
    }

    #[test]
    fn split_rules_match_torch() {
        let r = Rules::default();
        // Large pool: the rest is kept only when more than 1 MiB remains.
        assert!(!r.should_split(20 * MIB, 19 * MIB, false, false));
        assert!(r.should_split(20 * MIB, 18 * MIB + MIN_BLOCK, false, false));
        // Small pool and expandable segments: 512 B suffice.
        assert!(r.should_split(2 * MIB, 2 * MIB - 512, true, false));
        assert!(r.should_split(40 * MIB, 40 * MIB - 512, false, true));
        let capped = Rules { max_split_size: 256 * MIB, ..Rules::default() };
        assert!(!capped.should_split(1024 * MIB, 520 * MIB, false, false), "oversize requests take whole blocks");
        assert_eq!(Rules::segment_size(5 * MIB), 20 * MIB);
        assert_eq!(Rules::segment_size(11 * MIB), 12 * MIB);
    }

    #[test]
    fn settings_are_read_as_torch_writes_them() {
        let s = serde_json::json!({"max_split_size": 268435456, "expandable_segments": false,
            "roundup_power2_divisions": {"1": 0, "1024": 4}});
        let r = Rules::from_settings(Some(&s));
        assert_eq!(r.max_split_size_mb(), Some(256));
        assert_eq!(r.divisions[10], 4);
        let unlimited = Rules::from_settings(Some(&serde_json::json!({"max_split_size": -1})));
        assert_eq!(unlimited.max_split_size, u64::MAX);
    }
}
