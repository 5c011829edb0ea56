//! The walk's memory of how the list's items are laid out (`walk.rs`), so that it can step
//! over a whole item at once.
//!
//! Why: stepping opcode by opcode, each step waits for the one before (where an opcode starts
//! depends on the last one's length), so the walk ran no faster than the read it serves and
//! held the later part back. A trace's entries are a few dozen layouts repeated millions of
//! times: the same opcodes at the same places, only the operands differ. A shape keeps an
//! item's bytes with a mask over what fixes where each opcode starts (the opcodes, and a short
//! string's length byte); an item whose masked bytes equal a shape's walks exactly as that
//! shape did, so the walk adds its memo entries and steps past it in a few word compares.
//!
//! Only items the walk's table steps over alone become shapes: every opcode's length fixed or
//! given by one length byte, no memo put but MEMOIZE, and no MARK closed below the item's
//! own level. An item starts at an EMPTY_DICT directly in the batch and ends where the next
//! one starts.

/// The longest item kept as a shape, in bytes.
pub(super) const MAX_LEN: usize = 256;
const WORDS: usize = MAX_LEN / 8;
/// Shapes kept; a new one takes the place of the one unused longest.
const KEPT: usize = 16;

/// How the walk's table steps over an opcode (`walk::FAST`), as a shape needs it.
pub(super) enum Table {
    /// So many bytes, operands included.
    Fixed(usize),
    /// A length byte, then that many bytes.
    Short,
    /// MEMOIZE.
    Count,
    /// MARK.
    Open,
    /// An opcode that pops to the last MARK.
    Close,
    /// Anything else: not in a shape.
    Other,
}

struct Shape {
    len: usize,
    words: usize,
    bytes: [u64; WORDS],
    mask: [u64; WORDS],
    memo: u32,
    /// The shape the item after one of this shape had last time: tried first, since a trace's
    /// entries come in patterns (an allocation, its free requested, its free completed).
    next: usize,
    /// When it last fitted or was learnt, by `Shapes::clock`: the one unused longest gives way.
    used: u64,
}

/// Why the order and the eviction: big_trace's items are six shapes 99.8% of the time (an
/// allocation, its free requested and completed, each with a size of four bytes or two) and
/// a hundred rare ones (a frames list that pickles a new frame). Tried in the order they
/// were kept, the quarter of items the guess missed tried 8.4 shapes before one fitted; and a
/// new shape took the place of the oldest, so one-off items pushed the six out, to be learnt
/// again (2,800 times in 1.73M items).
#[derive(Default)]
pub(super) struct Shapes {
    kept: Vec<Shape>,
    /// Indexes into `kept`, the one found last by search first: where the guess does not fit,
    /// the search tries them in this order.
    order: Vec<usize>,
    /// The last item's shape, matched or learned.
    last: Option<usize>,
    /// Finds and learns so far: the clock of `Shape::used`.
    clock: u64,
}

impl Shapes {
    /// The shape `item` (the window from an item's start on) begins with, if any: its length
    /// and the memo entries it makes. `item` must hold at least `slack` bytes (8 or more) past
    /// the shape's end for the caller's own look-ahead; a shorter one matches nothing.
    #[inline]
    pub(super) fn find(&mut self, item: &[u8], slack: usize) -> Option<(usize, usize)> {
        self.clock += 1;
        let fits = |s: &Shape| s.len + slack <= item.len() && s.matches(item);
        let guess = self.last.and_then(|l| self.kept.get(l)).map(|s| s.next);
        let found = match guess {
            Some(g) if self.kept.get(g).is_some_and(fits) => Some(g),
            _ => {
                let at = self.order.iter().position(|&k| fits(&self.kept[k]));
                at.map(|at| {
                    self.order[..=at].rotate_right(1);
                    self.order[0]
                })
            }
        };
        if let (Some(l), Some(f)) = (self.last, found) {
            self.kept[l].next = f;
        }
        self.last = found;
        let s = &mut self.kept[found?];
        s.used = self.clock;
        Some((s.len, s.memo as usize))
    }

    /// Learns `item`, one whole item's bytes, as a shape if it can be one.
    pub(super) fn learn(&mut self, item: &[u8], table: impl Fn(u8) -> Table) {
        self.clock += 1;
        self.last = Shape::of(item, table, self.clock).map(|shape| {
            let at = if self.kept.len() < KEPT {
                self.kept.push(shape);
                self.order.push(self.kept.len() - 1);
                self.order.len() - 1
            } else {
                let unused = (0..KEPT).min_by_key(|&k| self.kept[k].used).unwrap_or(0);
                self.kept[unused] = shape;
                self.order.iter().position(|&k| k == unused).unwrap_or(0)
            };
            // First in the search's order: the items after it may well be of its shape.
            self.order[..=at].rotate_right(1);
            self.order[0]
        });
    }
}

impl Shape {
    fn of(item: &[u8], table: impl Fn(u8) -> Table, used: u64) -> Option<Shape> {
        if item.is_empty() || item.len() > MAX_LEN {
            return None;
        }
        let mut fixed = [0u8; MAX_LEN];
        let (mut p, mut depth, mut memo) = (0usize, 0u32, 0u32);
        while p < item.len() {
            fixed[p] = 0xff;
            p += match table(item[p]) {
                Table::Fixed(n) => n,
                Table::Short => {
                    *fixed.get_mut(p + 1)? = 0xff;
                    2 + *item.get(p + 1)? as usize
                }
                Table::Count => {
                    memo += 1;
                    1
                }
                Table::Open => {
                    depth += 1;
                    1
                }
                Table::Close => {
                    depth = depth.checked_sub(1)?;
                    1
                }
                Table::Other => return None,
            };
        }
        if p != item.len() || depth != 0 {
            return None;
        }
        let mut padded = [0u8; MAX_LEN];
        padded[..item.len()].copy_from_slice(item);
        let word = |b: &[u8; MAX_LEN], w: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[w * 8..w * 8 + 8]);
            u64::from_le_bytes(x)
        };
        let words = item.len().div_ceil(8);
        let mut shape = Shape { len: item.len(), words, bytes: [0; WORDS], mask: [0; WORDS], memo, next: 0, used };
        for w in 0..shape.words {
            shape.mask[w] = word(&fixed, w);
            shape.bytes[w] = word(&padded, w) & shape.mask[w];
        }
        Some(shape)
    }

    /// `item` holds at least `words * 8` bytes (the caller checked `len + slack`, and slack
    /// is at least 8).
    #[inline]
    fn matches(&self, item: &[u8]) -> bool {
        let Some(item) = item.get(..self.words * 8) else { return false };
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        // The last word alone, out if it differs: where a shape does not fit, an operand of
        // another width or another opcode has moved the opcodes after it, so its end differs
        // (every item starts with the same few opcodes: a first word alone ruled out none of
        // big_trace's shapes). Then every word with no branch, which compiles to a few vector
        // instructions a pair of words: a word at a time with a branch each was 8% of the
        // instructions of a read of train_big.
        let last = self.words - 1;
        match item.get(last * 8..last * 8 + 8) {
            Some(b) if word(b) & self.mask[last] == self.bytes[last] => {}
            _ => return false,
        }
        let mut diff = 0u64;
        for ((b, mask), bytes) in item.chunks_exact(8).zip(&self.mask).zip(&self.bytes) {
            diff |= (word(b) & mask) ^ bytes;
        }
        diff == 0
    }
}

/// The walk's table as a shape reads it, for its opcodes; `walk.rs` passes its own.
#[cfg(test)]
pub(super) fn test_table(code: u8) -> Table {
    use super::opcodes as op;
    match code {
        op::EMPTY_DICT | op::SETITEM => Table::Fixed(1),
        op::BINGET | op::BININT1 => Table::Fixed(2),
        op::SHORT_BINUNICODE => Table::Short,
        op::MEMOIZE => Table::Count,
        op::MARK => Table::Open,
        op::SETITEMS => Table::Close,
        _ => Table::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::super::opcodes as op;
    use super::*;

    const ENTRY: [u8; 14] = [
        op::EMPTY_DICT,
        op::MEMOIZE,
        op::MARK,
        op::BINGET,
        7,
        op::SHORT_BINUNICODE,
        2,
        b'h',
        b'i',
        op::MEMOIZE,
        op::BINGET,
        9,
        op::BININT1,
        5,
    ];

    fn entry_then_setitems() -> Vec<u8> {
        let mut e = ENTRY.to_vec();
        e.push(op::SETITEMS);
        e
    }

    #[test]
    fn an_item_with_other_operands_matches_and_one_laid_out_otherwise_does_not() {
        let mut shapes = Shapes::default();
        let e = entry_then_setitems();
        shapes.learn(&e, test_table);
        let mut other = e.clone();
        other[4] = 200; // another memo index
        other[7] = b'y'; // another string of the same length
        other[13] = 77; // another int
        other.extend_from_slice(&[0; MAX_LEN]);
        assert_eq!(shapes.find(&other, 16), Some((15, 2)));
        // A longer string moves every opcode after it.
        let mut longer = other.clone();
        longer[6] = 3;
        assert_eq!(shapes.find(&longer, 16), None);
        // Another opcode in place of the int.
        let mut changed = other.clone();
        changed[12] = op::BINGET;
        assert_eq!(shapes.find(&changed, 16), None);
        // Too little left after it for the caller's look-ahead.
        assert_eq!(shapes.find(&other[..15 + 15], 16), None);
    }

    #[test]
    fn only_items_the_table_steps_over_alone_become_shapes() {
        let mut shapes = Shapes::default();
        // Unbalanced: closes below its own level.
        shapes.learn(&[op::SETITEMS], test_table);
        // Opens a MARK it does not close.
        shapes.learn(&ENTRY, test_table);
        // An opcode the table does not know.
        shapes.learn(&[op::EMPTY_DICT, op::BINPUT, 3], test_table);
        // A string running past the end.
        shapes.learn(&[op::EMPTY_DICT, op::SHORT_BINUNICODE, 9, b'a'], test_table);
        shapes.learn(&[op::EMPTY_DICT, op::SHORT_BINUNICODE], test_table);
        // Too long.
        shapes.learn(&vec![op::EMPTY_DICT; MAX_LEN + 1], test_table);
        assert!(shapes.kept.is_empty());
        shapes.learn(&vec![op::EMPTY_DICT; MAX_LEN], test_table);
        assert_eq!(shapes.kept.len(), 1);
    }

    /// An item of one string of `n` bytes: items of different `n` have different shapes.
    fn item(n: u8) -> Vec<u8> {
        let mut item = vec![op::EMPTY_DICT, op::SHORT_BINUNICODE, n];
        item.resize(3 + n as usize, b'a');
        item
    }

    fn padded(mut item: Vec<u8>) -> Vec<u8> {
        item.resize(item.len() + MAX_LEN, 0);
        item
    }

    #[test]
    fn keeps_sixteen_the_one_unused_longest_giving_way() {
        let mut shapes = Shapes::default();
        for n in 1..=KEPT as u8 + 4 {
            shapes.learn(&item(n), test_table);
        }
        let lens: Vec<usize> = shapes.kept.iter().map(|s| s.len).collect();
        assert_eq!(lens.len(), KEPT);
        assert_eq!(lens[..5], [20, 21, 22, 23, 8], "strings of 1 to 4 gave way to 17 to 20");
        assert_eq!(shapes.find(&padded(item(6)), 16), Some((9, 0)));
        assert_eq!(shapes.find(&padded(item(2)), 16), None);
        // A string of 5 is the oldest learnt, but one of 6 was found since: a one-off item
        // takes the place of the 5, not of the 6.
        shapes.learn(&item(100), test_table);
        assert_eq!(shapes.find(&padded(item(5)), 16), None);
        assert_eq!(shapes.find(&padded(item(6)), 16), Some((9, 0)));
        assert_eq!(shapes.find(&padded(item(100)), 16), Some((103, 0)));
    }

    #[test]
    fn tries_first_the_shape_that_followed_the_last_one_then_the_one_found_last() {
        let mut shapes = Shapes::default();
        shapes.learn(&item(3), test_table); // slot 0
        shapes.learn(&item(2), test_table); // slot 1
        shapes.learn(&[op::EMPTY_DICT], test_table); // slot 2: fits every item
        // Only the catch-all fits a string of 4, after a string of 3.
        assert_eq!(shapes.find(&padded(item(3)), 16), Some((6, 0)));
        assert_eq!(shapes.find(&padded(item(4)), 16), Some((1, 0)));
        // After a string of 3 again, the catch-all is tried first and taken, though the
        // shape in slot 1 fits too.
        assert_eq!(shapes.find(&padded(item(3)), 16), Some((6, 0)));
        assert_eq!(shapes.find(&padded(item(2)), 16), Some((1, 0)));
        // Where the guess does not fit, the search goes in the order the shapes were last
        // found by it or learnt: the catch-all first.
        assert_eq!(shapes.find(&padded(item(3)), 16), Some((6, 0)));
        shapes.last = Some(1);
        assert_eq!(shapes.find(&padded(item(2)), 16), Some((1, 0)));
        assert_eq!(shapes.order, [2, 1, 0]);
        // Found by the search, a shape moves to the front of its order.
        let mut other = Shapes::default();
        for n in [3, 2, 7] {
            other.learn(&item(n), test_table);
        }
        assert_eq!(other.order, [2, 1, 0], "the one learnt last first");
        other.last = None;
        assert_eq!(other.find(&padded(item(3)), 16), Some((6, 0)));
        assert_eq!(other.order, [0, 2, 1]);
        other.last = None;
        assert_eq!(other.find(&padded(item(2)), 16), Some((5, 0)));
        assert_eq!(other.order, [1, 0, 2]);
    }
}
