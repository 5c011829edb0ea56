//! A frames list's frame-dict handles as a map key, kept in the map's own slot where it is
//! short (most python stacks are a dozen frames or fewer).
//!
//! Why: as a boxed slice, every lookup that met a key read it from another allocation, a cache
//! miss per fresh frames list; on a real training trace (a GPT with python stacks, 3M events)
//! those compares were a tenth of a one-core read.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

/// Handles held in the slot itself.
const INLINE: usize = 12;

#[derive(Clone, Debug)]
pub(super) enum Nodes {
    Inline { len: u8, nodes: [u32; INLINE] },
    Boxed(Box<[u32]>),
}

impl From<&[u32]> for Nodes {
    fn from(s: &[u32]) -> Self {
        if s.len() <= INLINE {
            let mut nodes = [0; INLINE];
            nodes[..s.len()].copy_from_slice(s);
            Nodes::Inline { len: s.len() as u8, nodes }
        } else {
            Nodes::Boxed(s.into())
        }
    }
}

impl Borrow<[u32]> for Nodes {
    fn borrow(&self) -> &[u32] {
        match self {
            Nodes::Inline { len, nodes } => &nodes[..(*len as usize).min(INLINE)],
            Nodes::Boxed(b) => b,
        }
    }
}

// Hash and equality are the slice's, as `Borrow` requires: a map keyed by `Nodes` is looked up
// by `&[u32]`.
impl Hash for Nodes {
    fn hash<H: Hasher>(&self, state: &mut H) {
        <Self as Borrow<[u32]>>::borrow(self).hash(state);
    }
}

impl PartialEq for Nodes {
    fn eq(&self, other: &Self) -> bool {
        <Self as Borrow<[u32]>>::borrow(self) == <Self as Borrow<[u32]>>::borrow(other)
    }
}

impl Eq for Nodes {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_lists_are_found_by_their_handles() {
        let mut map: foldhash::HashMap<Nodes, u32> = foldhash::HashMap::default();
        let short: Vec<u32> = (0..INLINE as u32).collect();
        let long: Vec<u32> = (0..INLINE as u32 + 1).collect();
        map.insert(Nodes::from(&short[..]), 1);
        map.insert(Nodes::from(&long[..]), 2);
        map.insert(Nodes::from(&[][..]), 3);
        assert!(matches!(Nodes::from(&short[..]), Nodes::Inline { .. }));
        assert!(matches!(Nodes::from(&long[..]), Nodes::Boxed(_)));
        assert_eq!(map.get(&short[..]), Some(&1));
        assert_eq!(map.get(&long[..]), Some(&2));
        assert_eq!(map.get(&[][..]), Some(&3));
        // A prefix, or the same handles padded with the zeros an inline slot holds, is another list.
        assert_eq!(map.get(&short[..INLINE - 1]), None);
        assert_eq!(map.get(&[0u32, 1, 2, 0][..]), None);
        assert_eq!(map.get(&[0u32][..]), None);
    }
}
