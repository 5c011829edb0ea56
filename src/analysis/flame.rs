//! The memory alive at one event as a tree of the stacks that made it: an icicle, outermost
//! frame at the top, each node as wide as the bytes of the live blocks whose stacks pass
//! through it. Built from the replay's state at the event; nodes too small to see at any zoom
//! a page offers are folded into their parent, so the answer stays small on a trace of
//! millions of events.

use foldhash::{HashMap, HashMapExt};
use serde::Serialize;

use super::categories::{Category, Labels};
use super::memory::live_blocks;
use crate::replay::State;
use crate::snapshot::{FrameId, Snapshot};

/// The tree in columns, parents before children and children largest first (the page lays
/// them out in order). Node 0 is the root: everything alive.
#[derive(Debug, Clone, Serialize)]
pub struct Flame {
    /// The event the state follows (None: before the first).
    pub event: Option<u64>,
    /// Bytes alive (the root's width).
    pub total_bytes: u64,
    /// Frame names, `function (file:line)`, referred to by `name`.
    pub names: Vec<String>,
    /// Each node's parent (the root's is itself, 0).
    pub parent: Vec<u32>,
    /// Each node's frame, an index into `names`.
    pub name: Vec<u32>,
    /// Bytes of the live blocks whose stacks pass through the node.
    pub bytes: Vec<u64>,
    /// The category that holds most of those bytes.
    pub category: Vec<Category>,
    /// Bytes folded into a node from children below `min_bytes`.
    pub min_bytes: u64,
}

/// Nodes narrower than this share of everything alive are folded into their parent: at the
/// deepest zoom a page offers (1/1000 of the width) they would still be under a pixel.
const FOLD_BELOW: u64 = 200_000;

/// The most nodes an answer holds; past it the smallest are folded too.
const MAX_NODES: usize = 20_000;

struct Node {
    parent: u32,
    name: u32,
    bytes: u64,
    by_category: [u64; Category::ALL.len()],
}

/// The icicle of `state`, the state right after `event`.
pub fn flame(snapshot: &Snapshot, state: &State, labels: &Labels, event: Option<u64>) -> Flame {
    // Bytes by (stack, category) first: blocks share stacks far more than stacks share frames.
    let mut by_stack: HashMap<(u32, Category), u64> = HashMap::new();
    for b in live_blocks(state) {
        *by_stack.entry((b.stack, labels.of(b))).or_insert(0) += b.size;
    }
    let mut names: Vec<String> = vec!["all live memory".into(), "(no frames recorded)".into()];
    let mut name_of: HashMap<FrameId, u32> = HashMap::new();
    let mut nodes = vec![Node { parent: 0, name: 0, bytes: 0, by_category: [0; Category::ALL.len()] }];
    let mut child: HashMap<(u32, u32), u32> = HashMap::new();
    let mut entries: Vec<((u32, Category), u64)> = by_stack.into_iter().collect();
    entries.sort_unstable_by_key(|((s, c), _)| (*s, c.as_str()));
    for ((stack, category), size) in entries {
        let c = Category::ALL.iter().position(|x| *x == category).unwrap_or(Category::ALL.len() - 1);
        let mut at = 0u32;
        let add = |nodes: &mut Vec<Node>, at: u32| {
            let n = &mut nodes[at as usize];
            n.bytes += size;
            n.by_category[c] += size;
        };
        add(&mut nodes, 0);
        let frames = snapshot.stacks.frame_ids(stack as crate::snapshot::StackId);
        let path: Vec<u32> = if frames.is_empty() {
            vec![1]
        } else {
            frames
                .iter()
                .rev()
                .map(|f| {
                    *name_of.entry(*f).or_insert_with(|| {
                        let fr = snapshot.stacks.frame(*f);
                        names.push(format!(
                            "{} ({}:{})",
                            snapshot.stacks.str(fr.name),
                            snapshot.stacks.str(fr.filename),
                            fr.line
                        ));
                        (names.len() - 1) as u32
                    })
                })
                .collect()
        };
        for name in path {
            let next = *child.entry((at, name)).or_insert_with(|| {
                nodes.push(Node { parent: at, name, bytes: 0, by_category: [0; Category::ALL.len()] });
                (nodes.len() - 1) as u32
            });
            add(&mut nodes, next);
            at = next;
        }
    }
    let total = nodes[0].bytes;
    let mut min_bytes = (total / FOLD_BELOW).max(1);
    // Past the node cap, fold at the size that keeps MAX_NODES of them.
    let mut sizes: Vec<u64> = nodes.iter().map(|n| n.bytes).filter(|b| *b >= min_bytes).collect();
    if sizes.len() > MAX_NODES {
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        min_bytes = sizes[MAX_NODES - 1] + 1;
    }
    columns(event, total, names, nodes, min_bytes)
}

/// Keeps the nodes of at least `min_bytes` (a node's bytes are at least its children's, so
/// the kept ones form a tree), parents first, children largest first.
fn columns(event: Option<u64>, total: u64, names: Vec<String>, nodes: Vec<Node>, min_bytes: u64) -> Flame {
    let mut children: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate().skip(1) {
        if n.bytes >= min_bytes {
            children[n.parent as usize].push(i as u32);
        }
    }
    for c in children.iter_mut() {
        c.sort_by(|a, b| nodes[*b as usize].bytes.cmp(&nodes[*a as usize].bytes).then(a.cmp(b)));
    }
    let mut out = Flame {
        event,
        total_bytes: total,
        names: Vec::new(),
        parent: Vec::new(),
        name: Vec::new(),
        bytes: Vec::new(),
        category: Vec::new(),
        min_bytes,
    };
    let mut renamed: HashMap<u32, u32> = HashMap::new();
    // Breadth first: parents before children, siblings in order.
    let mut queue = std::collections::VecDeque::from([(0u32, 0u32)]);
    while let Some((old, parent)) = queue.pop_front() {
        let n = &nodes[old as usize];
        let next_name = renamed.len() as u32;
        let name = *renamed.entry(n.name).or_insert(next_name);
        let id = out.parent.len() as u32;
        out.parent.push(parent);
        out.name.push(name);
        out.bytes.push(n.bytes);
        let top = (0..n.by_category.len()).max_by_key(|c| (n.by_category[*c], std::cmp::Reverse(*c))).unwrap_or(0);
        out.category.push(Category::ALL[top]);
        for c in &children[old as usize] {
            queue.push_back((*c, id));
        }
    }
    let mut list = vec![String::new(); renamed.len()];
    for (old, new) in renamed {
        list[new as usize] = names[old as usize].clone();
    }
    out.names = list;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(parent: u32, name: u32, bytes: u64) -> Node {
        let mut by_category = [0; Category::ALL.len()];
        by_category[0] = bytes;
        Node { parent, name, bytes, by_category }
    }

    #[test]
    fn small_nodes_fold_into_their_parent_and_children_come_largest_first() {
        let nodes = vec![node(0, 0, 100), node(0, 2, 30), node(0, 3, 69), node(1, 4, 1), node(2, 5, 60)];
        let names: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
        let f = columns(Some(7), 100, names, nodes, 2);
        assert_eq!(f.bytes, vec![100, 69, 30, 60], "the 1-byte node is folded; 69 before 30");
        assert_eq!(f.parent, vec![0, 0, 0, 1]);
        let named: Vec<&str> = f.name.iter().map(|n| f.names[*n as usize].as_str()).collect();
        assert_eq!(named, vec!["f0", "f3", "f2", "f5"]);
    }
}
