//! Index-addressed storage with recycled slots, shared by the replay state and the
//! allocator model: blocks come and go by the million, so their records live in one
//! `Vec` and freed indexes are reused instead of growing it.

/// Stores `rec` in a spare slot if there is one, else at the end; returns its index.
pub(crate) fn put<T>(slots: &mut Vec<T>, spare: &mut Vec<u32>, rec: T) -> u32 {
    match spare.pop() {
        Some(i) => {
            slots[i as usize] = rec;
            i
        }
        None => {
            slots.push(rec);
            (slots.len() - 1) as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::put;

    #[test]
    fn reuses_spare_slots_before_growing() {
        let (mut slots, mut spare) = (vec!['a', 'b'], vec![0]);
        assert_eq!(put(&mut slots, &mut spare, 'c'), 0);
        assert_eq!(put(&mut slots, &mut spare, 'd'), 2);
        assert_eq!(slots, ['c', 'b', 'd']);
    }
}
