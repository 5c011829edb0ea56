//! Call sites: the frame of a stack that a user would recognise as "where this was allocated".
//!
//! torch records stacks innermost first, and the innermost frames are usually torch's own
//! (`torch/nn/modules/module.py`, `torch/optim/adam.py`). The call site is the innermost frame
//! outside the torch package and outside C/C++ sources; if every frame is torch's, the
//! innermost one.

use serde::{Deserialize, Serialize};

use super::{Frame, StackId, Stacks};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CallSite {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

impl CallSite {
    fn of(stacks: &Stacks, f: &Frame) -> CallSite {
        CallSite { filename: stacks.str(f.filename).to_string(), line: f.line, name: stacks.str(f.name).to_string() }
    }
}

impl std::fmt::Display for CallSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} ({})", self.filename, self.line, self.name)
    }
}

/// Frames in torch itself, in installed packages and the standard library, or in native code,
/// which no user edits to fix their memory.
pub fn is_library_frame(filename: &str) -> bool {
    let f = filename.replace('\\', "/");
    f.contains("/torch/")
        || f.contains("/site-packages/")
        || f.contains("/dist-packages/")
        || f.contains("/lib/python3")
        || f.starts_with("<frozen ")
        || f.starts_with("torch/")
        || [".cpp", ".h", ".cu", ".cuh", ".cc"].iter().any(|ext| f.ends_with(ext))
        || f == "??"
        || f.is_empty()
}

/// The call site of a stack, if it has frames.
pub fn call_site(stacks: &Stacks, stack: StackId) -> Option<CallSite> {
    let mut first = None;
    for f in stacks.frames(stack) {
        first.get_or_insert(f);
        if !is_library_frame(stacks.str(f.filename)) {
            return Some(CallSite::of(stacks, f));
        }
    }
    first.map(|f| CallSite::of(stacks, f))
}

/// The whole stack as call sites, innermost first, for tooltips and details.
pub fn frames(stacks: &Stacks, stack: StackId) -> Vec<CallSite> {
    stacks.frames(stack).map(|f| CallSite::of(stacks, f)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_and_native_frames_are_library() {
        assert!(is_library_frame("/opt/venv/lib/python3.12/site-packages/torch/nn/modules/module.py"));
        assert!(is_library_frame("c10/cuda/CUDACachingAllocator.cpp"));
        assert!(!is_library_frame("repro/gen_real_snapshots.py"));
        assert!(!is_library_frame("/home/me/torchvision_utils.py"));
        assert!(is_library_frame("/usr/lib/python3.12/concurrent/futures/thread.py"));
        assert!(is_library_frame("/opt/venv/lib/python3.12/site-packages/transformers/modeling_utils.py"));
    }
}
