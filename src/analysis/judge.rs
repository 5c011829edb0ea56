//! The verdict from what the step needed, not only from the failing request: `capacity` when
//! the projected need exceeds the budget whatever the allocator does (the memory may also have
//! been fragmented at the failing request: the summary says both); `fragmentation` when the
//! need fits the budget and free memory pinned in pieces is what failed; and where the need or
//! the budget cannot be told well enough, the instant's verdict, saying so.

use super::advice::{Diagnosis, DiagnosisVerdict};
use super::need::{Method, Need};
use crate::units::bytes;

/// Sets the verdict and completes the summary from `need` (for a run with an OOM).
pub fn judge(diagnosis: &mut Diagnosis, need: &Need) {
    let (Some(alloc), Some(budget)) = (need.peak_allocated_bytes, need.budget_bytes) else {
        if diagnosis.verdict == DiagnosisVerdict::Capacity {
            diagnosis.summary.push_str(" The live tensors need more memory than the budget; no allocator setting can serve this request, only using less memory can.");
        }
        if need.method == Method::Unknown && !need.basis.is_empty() {
            diagnosis.summary.push_str(&format!(" What the step needed could not be projected: {}", need.basis));
        }
        return;
    };
    let budget_text = match need.budget_upper_bytes {
        Some(upper) => format!("a budget between {} and {}", bytes(budget), bytes(upper)),
        None => format!("the {} budget", bytes(budget)),
    };
    let reserved = need.peak_reserved_bytes.unwrap_or(alloc);
    let need_text = format!("about {} allocated ({} reserved)", bytes(alloc), bytes(reserved));
    let lower = if need.method == Method::FirstStep || need.method == Method::LowerBound { "at least " } else { "" };
    match need.fits {
        Some(false) => {
            let was = diagnosis.verdict;
            diagnosis.verdict = DiagnosisVerdict::Capacity;
            let head = format!(
                "The step needs {lower}{need_text} against {budget_text}: more than the budget whatever the allocator does, so this is capacity: only using less memory makes it fit."
            );
            diagnosis.summary = if was == DiagnosisVerdict::Fragmentation {
                format!(
                    "{head} At the failing request memory was fragmented too, but defragmenting it only gets the step past that request. {}",
                    diagnosis.summary
                )
            } else {
                format!("{} {head}", diagnosis.summary)
            };
        }
        Some(true) if diagnosis.verdict == DiagnosisVerdict::Fragmentation => diagnosis.summary.push_str(&format!(
            " The step needs {lower}{need_text}, within {budget_text}: the free memory pinned in pieces is what failed."
        )),
        Some(true) => diagnosis.summary.push_str(&format!(
            " The step needs {lower}{need_text}, within {budget_text} by the projection, which leaves little room for the allocator's cache: the request failed on memory held cached in pieces too small for it. Less memory (the remedies below) makes room for certain."
        )),
        None => diagnosis.summary.push_str(&format!(
            " The step needs {lower}{need_text}, about as much as {budget_text}: whether it fits cannot be told from the recording (pass --capacity with the job's real budget)."
        )),
    }
    diagnosis.summary.push_str(&format!(" ({})", need.basis.trim_end_matches('.')));
    diagnosis.summary.push('.');
}

#[cfg(test)]
mod tests {
    use crate::analysis::advice::{DiagnosisVerdict, Effect, RemedyKind};
    use crate::analysis::{Depth, analyze};
    use crate::testkit::{Frame, MIB, SnapshotBuilder};

    const MODEL: Frame = ("model.py", 10, "forward");
    const ACT: Frame = ("model.py", 12, "forward");
    const PIN: Frame = ("model.py", 14, "forward");
    const MOVE: Frame = ("/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", 1370, "_apply");
    const INIT_STATE: Frame = ("/venv/lib/python3.12/site-packages/torch/optim/adam.py", 160, "_init_group");
    const STEP: Frame = ("/venv/lib/python3.12/site-packages/torch/optim/adam.py", 220, "step");
    const BASE: u64 = 0x7f00_0000_0000;

    /// The case #30 names: a whole step 1 that peaks at P with no optimizer state, and a step 2
    /// that has the state S more and fails, in its forward, on a 172 MiB request while 880 MiB
    /// sit free in 44 MiB pieces, under a budget below P + S.
    fn batch_too_big_that_looks_fragmented() -> crate::snapshot::Snapshot {
        batch_too_big(SnapshotBuilder::new())
    }

    fn batch_too_big(mut b: SnapshotBuilder) -> crate::snapshot::Snapshot {
        let at = |i: u64| BASE + i * (1 << 30);
        type Blocks = Vec<(u64, &'static str, &'static [Frame])>;
        let mut segments: Vec<(u64, u64, Blocks)> = Vec::new();
        for p in 0..4 {
            b = b.alloc_in_new_segment(at(p), 500 * MIB, 500 * MIB, &[MOVE, MODEL]);
            segments.push((at(p), 500 * MIB, vec![(500 * MIB, "active_allocated", &[MOVE, MODEL])]));
        }
        // Step 1's forward: 20 small blocks that outlive it, each splitting a freed 46 MiB one.
        for k in 0..20 {
            let a = at(10 + k);
            b = b.alloc_in_new_segment(a, 46 * MIB, 46 * MIB, &[PIN, MODEL]).free(a, 46 * MIB, &[PIN, MODEL]);
            b = b.event("alloc", a, 2 * MIB, &[PIN, MODEL]);
            segments.push((
                a,
                46 * MIB,
                vec![(2 * MIB, "active_allocated", &[PIN, MODEL]), (44 * MIB, "inactive", &[])],
            ));
        }
        for k in 0..35 {
            b = b.alloc_in_new_segment(at(40 + k), 172 * MIB, 172 * MIB, &[ACT, MODEL]);
        }
        // Its backward frees the activations and makes gradients (no frames: autograd's thread).
        for k in 0..35 {
            b = b.free(at(40 + k), 172 * MIB, &[]).event("segment_free", at(40 + k), 172 * MIB, &[]);
        }
        for g in 0..4 {
            b = b.alloc_in_new_segment(at(80 + g), 500 * MIB, 500 * MIB, &[]);
        }
        // Its optimizer step makes the state (kept) and frees the gradients (zero_grad).
        for s in 0..8 {
            b = b.alloc_in_new_segment(at(90 + s), 500 * MIB, 500 * MIB, &[INIT_STATE, STEP]);
            segments.push((at(90 + s), 500 * MIB, vec![(500 * MIB, "active_allocated", &[INIT_STATE, STEP])]));
        }
        for g in 0..4 {
            b = b.free(at(80 + g), 500 * MIB, &[STEP]).event("segment_free", at(80 + g), 500 * MIB, &[STEP]);
        }
        // Step 2's forward: 12 activations, then the 13th fails.
        for k in 0..12 {
            b = b.alloc_in_new_segment(at(40 + k), 172 * MIB, 172 * MIB, &[ACT, MODEL]);
            segments.push((at(40 + k), 172 * MIB, vec![(172 * MIB, "active_allocated", &[ACT, MODEL])]));
        }
        b = b.event("oom", 80 << 30, 172 * MIB, &[ACT, MODEL]);
        segments.sort_by_key(|s| s.0);
        for (a, size, blocks) in &segments {
            b = b.segment(*a, *size, blocks);
        }
        b.build()
    }

    #[test]
    fn a_step_that_needs_more_than_the_budget_is_capacity_though_its_failing_request_looks_fragmented() {
        let s = batch_too_big_that_looks_fragmented();
        let a = analyze(&s, Default::default(), Depth::Report).analysis;
        let d = &a.devices[0];
        let oom = &d.ooms[0];
        assert_eq!(oom.verdict, crate::analysis::oom::Verdict::Fragmentation, "the instant alone says fragmentation");
        assert_eq!(oom.reserved_bytes - oom.allocated_bytes, 880 * MIB);
        assert_eq!(oom.largest_usable_free_bytes, 44 * MIB);
        let g = &d.diagnosis;
        assert_eq!(g.verdict, DiagnosisVerdict::Capacity, "{}", g.summary);
        // P (step 1's peak: weights, the small blocks, 35 activations) plus S (the state).
        let (p, state) = ((2000 + 40 + 35 * 172) * MIB, 4000 * MIB);
        let need = g.need.peak_allocated_bytes.unwrap();
        assert!(
            need.abs_diff(p + state) * 100 <= p + state,
            "need {} MiB, P + S {} MiB",
            need / MIB,
            (p + state) / MIB
        );
        assert_eq!(g.need.fits, Some(false));
        assert!(g.summary.contains("fragmented too"), "{}", g.summary);
        for r in
            g.remedies.iter().filter(|r| r.kind == RemedyKind::ExpandableSegments || r.kind == RemedyKind::MaxSplitSize)
        {
            assert_ne!(r.fit.effect, Some(Effect::Fixes), "{:?}: the step needs more than the budget", r.kind);
        }
        let expandable = g.remedies.iter().find(|r| r.kind == RemedyKind::ExpandableSegments).unwrap();
        assert_eq!(expandable.fit.effect, Some(Effect::Helps), "{:?}", expandable.predicted);
        assert!(expandable.predicted.as_deref().unwrap_or("").contains("still needs"));
        assert!(
            g.remedies.iter().any(|r| r.kind == RemedyKind::SmallerBatch),
            "capacity remedies whatever the instant said"
        );
    }

    #[test]
    fn a_budget_the_capture_client_recorded_decides_whether_the_step_fits() {
        // The same job on a GPU whose recorded per-process budget (16 GiB) holds the step's
        // ~11.8 GiB: then the pieces are what failed, and the allocator settings are the remedy.
        let s = batch_too_big(SnapshotBuilder::new().recorded(100 << 30, 16 << 30));
        assert_eq!(s.recorded[0].budget_bytes, Some(16 << 30));
        let a = analyze(&s, Default::default(), Depth::Report).analysis;
        let g = &a.devices[0].diagnosis;
        assert_eq!(g.need.budget_bytes, Some(16 << 30));
        assert!(g.need.budget_basis.as_deref().unwrap_or("").contains("recorded at capture"), "{:?}", g.need);
        assert_eq!(g.need.fits, Some(true));
        assert_eq!(g.verdict, DiagnosisVerdict::Fragmentation, "{}", g.summary);
        // With the device's total recorded, what the process held outside PyTorch is told:
        // 100 GiB total, 80 GiB free by the OOM event, 8984 MiB reserved at the OOM.
        let outside = g.outside.as_ref().expect("the outside memory is told");
        assert_eq!(outside.device_total_bytes, Some(100 << 30));
        assert_eq!(outside.reserved_bytes, 8984 * MIB);
        assert_eq!(outside.outside_bytes, Some((20 << 30) - 8984 * MIB));
    }
}
