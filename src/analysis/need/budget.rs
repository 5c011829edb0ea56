//! The memory budget a job had, and what its process held outside PyTorch's allocator.
//!
//! The snapshot does not record the budget. In order of trust: the one the user gives
//! (`--capacity`); the one the capture client recorded beside the snapshot (the device's total
//! times the per-process memory fraction); the GPU itself, when the OOM's `device_free` (what
//! cudaMemGetInfo said when cudaMalloc failed) is less than the segment asked for: the process
//! could have reserved at most that much more; else only a range: at least the most the process
//! ever held reserved, and less than what it held at the OOM plus the segment it asked for.
//!
//! Outside the allocator: `device_free` with the device's total tells how much of the GPU was
//! neither free nor reserved by PyTorch: the CUDA context, NCCL's buffers, cuBLAS workspaces,
//! other processes on the same GPU.

use serde::{Deserialize, Serialize};

use crate::analysis::oom::Oom;
use crate::units::bytes;

/// The budget, exactly or as a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The budget, or its lower bound: what surely fits.
    pub bytes: u64,
    /// Where only a range is known, its upper bound: a need above it surely does not fit.
    pub upper: u64,
    pub basis: String,
}

/// What the user and the capture client tell about the device.
#[derive(Debug, Clone, Copy, Default)]
pub struct Known {
    pub capacity: Option<u64>,
    /// The per-process budget the capture client recorded.
    pub recorded_budget: Option<u64>,
    pub device_total: Option<u64>,
}

/// The budget of a job that ran out of memory at `oom` and reserved at most `peak_reserved`.
pub fn of_oom(oom: &Oom, peak_reserved: u64, known: &Known) -> Budget {
    let exact = |bytes: u64, basis: String| Budget { bytes, upper: bytes, basis };
    if let Some(c) = known.capacity {
        return exact(c, format!("{} as given", bytes(c)));
    }
    if let Some(b) = known.recorded_budget {
        return exact(b, format!("{}, the per-process budget recorded at capture", bytes(b)));
    }
    if oom.device_free_bytes < oom.allocation_bytes {
        let b = oom.reserved_bytes + oom.device_free_bytes;
        return exact(
            b,
            format!(
                "about {}: the GPU itself was full (cudaMalloc found {} free for a {} segment)",
                bytes(b),
                bytes(oom.device_free_bytes),
                bytes(oom.allocation_bytes)
            ),
        );
    }
    let lower = oom.reserved_bytes.max(peak_reserved);
    let upper = (oom.reserved_bytes + oom.allocation_bytes).max(lower);
    Budget {
        bytes: lower,
        upper,
        basis: format!(
            "between {} (the most the process held reserved) and {} (what it held at the OOM plus the segment it asked for): the GPU had {} free, so a per-process limit was set; pass --capacity for the exact figure",
            bytes(lower),
            bytes(upper),
            bytes(oom.device_free_bytes)
        ),
    }
}

/// Memory on the device outside PyTorch's caching allocator, at the OOM.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outside {
    /// The device's total memory, where known.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub device_total_bytes: Option<u64>,
    /// Free on the device when the allocation failed (cudaMemGetInfo).
    pub device_free_bytes: u64,
    /// Reserved by PyTorch's allocator then.
    pub reserved_bytes: u64,
    /// Neither free nor PyTorch's: the CUDA context, NCCL, cuBLAS workspaces, other processes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub outside_bytes: Option<u64>,
    pub basis: String,
}

pub fn outside(oom: &Oom, known: &Known) -> Outside {
    let (free, reserved) = (oom.device_free_bytes, oom.reserved_bytes);
    let Some(total) = known.device_total else {
        return Outside {
            device_total_bytes: None,
            device_free_bytes: free,
            reserved_bytes: reserved,
            outside_bytes: None,
            basis: format!(
                "The GPU had {} free at the OOM; the snapshot does not record the device's total, so what the process holds outside PyTorch cannot be told from it (pass --device-total, or capture with fragscope's client, which records it).",
                bytes(free)
            ),
        };
    };
    let outside = total.saturating_sub(free).saturating_sub(reserved);
    Outside {
        device_total_bytes: Some(total),
        device_free_bytes: free,
        reserved_bytes: reserved,
        outside_bytes: Some(outside),
        basis: format!(
            "Of the device's {}, {} was free and PyTorch reserved {}: {} was held outside PyTorch's allocator (the CUDA context, NCCL buffers, cuBLAS workspaces, or other processes on this GPU). nvidia-smi counts it; torch.cuda.memory_reserved() does not.",
            bytes(total),
            bytes(free),
            bytes(reserved),
            bytes(outside)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::oom::Verdict;

    fn oom(reserved: u64, allocation: u64, device_free: u64) -> Oom {
        Oom {
            event_index: 0,
            time_us: None,
            requested_bytes: allocation,
            allocation_bytes: allocation,
            pool: "large".into(),
            stream: 0,
            reserved_bytes: reserved,
            allocated_bytes: reserved,
            largest_usable_free_bytes: 0,
            pinned_free_bytes: 0,
            device_free_bytes: device_free,
            verdict: Verdict::Capacity,
            call_site: None,
            pinners: vec![],
            gaps: vec![],
        }
    }

    #[test]
    fn a_full_gpu_gives_the_budget_and_a_limit_only_a_range() {
        let full = of_oom(&oom(100, 30, 10), 90, &Known::default());
        assert_eq!((full.bytes, full.upper), (110, 110));
        let limited = of_oom(&oom(100, 30, 1000), 105, &Known::default());
        assert_eq!((limited.bytes, limited.upper), (105, 130));
        let given = of_oom(&oom(100, 30, 1000), 105, &Known { capacity: Some(120), ..Known::default() });
        assert_eq!((given.bytes, given.upper), (120, 120));
    }

    #[test]
    fn outside_is_what_is_neither_free_nor_reserved() {
        let o = outside(&oom(100, 30, 1000), &Known { device_total: Some(1150), ..Known::default() });
        assert_eq!(o.outside_bytes, Some(50));
        assert!(outside(&oom(100, 30, 1000), &Known::default()).outside_bytes.is_none());
    }
}
