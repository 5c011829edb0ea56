//! Interned frames and stacks. torch shares each distinct frame dict and frames list; this
//! table keeps one copy of each, and every block and event refers to a stack by id.

use foldhash::{HashMap, HashMapExt};

use crate::reader::{StrId, Strings};

/// Index of an interned stack.
pub type StackId = u32;
/// Index of an interned frame.
pub type FrameId = u32;

/// The empty stack (inactive blocks, entries recorded without frames).
pub const EMPTY_STACK: StackId = 0;

/// One Python or C++ frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Its file.
    pub filename: StrId,
    /// Its line.
    pub line: i64,
    /// Its function.
    pub name: StrId,
}

/// Interned frames and stacks, shared by every event and block.
#[derive(Debug, Clone)]
pub struct Stacks {
    /// The strings frames name.
    pub strings: Strings,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, FrameId>,
    /// Frames of all stacks, back to back; stack i is `flat[spans[i]]`.
    flat: Vec<FrameId>,
    spans: Vec<(u32, u32)>,
    stack_ids: HashMap<Vec<FrameId>, StackId>,
}

impl Default for Stacks {
    fn default() -> Self {
        Stacks {
            strings: Strings::default(),
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            flat: Vec::new(),
            spans: vec![(0, 0)],
            stack_ids: HashMap::from_iter([(Vec::new(), EMPTY_STACK)]),
        }
    }
}

impl Stacks {
    /// Interns a frame.
    pub fn frame_id(&mut self, frame: Frame) -> FrameId {
        let next = self.frames.len() as FrameId;
        *self.frame_ids.entry(frame).or_insert_with(|| {
            self.frames.push(frame);
            next
        })
    }

    /// Interns a stack, innermost frame first.
    pub fn stack_id(&mut self, frames: &[FrameId]) -> StackId {
        if let Some(&id) = self.stack_ids.get(frames) {
            return id;
        }
        let id = self.spans.len() as StackId;
        self.spans.push((self.flat.len() as u32, frames.len() as u32));
        self.flat.extend_from_slice(frames);
        self.stack_ids.insert(frames.to_vec(), id);
        id
    }

    /// Frames of a stack, innermost first (as torch records them).
    pub fn frames(&self, stack: StackId) -> impl Iterator<Item = &Frame> + '_ {
        let (start, len) = self.spans.get(stack as usize).copied().unwrap_or((0, 0));
        self.flat[start as usize..(start + len) as usize].iter().map(|&f| &self.frames[f as usize])
    }

    /// A frame by id.
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id as usize]
    }

    /// The frame ids of a stack, innermost first.
    pub(crate) fn frame_ids(&self, stack: StackId) -> &[FrameId] {
        let (start, len) = self.spans.get(stack as usize).copied().unwrap_or((0, 0));
        &self.flat[start as usize..(start + len) as usize]
    }

    /// How many distinct frames there are.
    pub(crate) fn frame_count(&self) -> usize {
        self.frames.len()
    }

    /// How many distinct stacks there are.
    pub fn stack_count(&self) -> usize {
        self.spans.len()
    }

    /// The text of a string id.
    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id)
    }
}
