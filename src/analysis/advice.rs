//! The diagnosis: the verdict in one sentence with its numbers, and the four remedies, each
//! with whether it applies here and why, in order of preference (least code change first).
//!
//! - `expandable_segments`: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
//! - `mempool`: a `torch.cuda.MemPool` around the call site that makes the big blocks, so they
//!   get segments of their own and small long-lived blocks can no longer land in them.
//! - `max_split_size`: `max_split_size_mb:N` with N just under the big blocks (at least 20),
//!   so requests smaller than N never split them.
//! - `reuse_buffer`: preallocate once when one call site asks for the same size again and again.

use serde::{Deserialize, Serialize};

use super::gaps::Pinned;
use super::oom::{Oom, Verdict};
use super::rhythm::Rhythm;
use crate::replay::rules::{LARGE_BUFFER, Rules, SMALL_BUFFER, SMALL_SIZE};
use crate::snapshot::sites::CallSite;
use crate::units::{bytes, torch_size};

const MIB: u64 = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Diagnosis {
    /// From the first OOM, or `no_oom`.
    pub verdict: DiagnosisVerdict,
    pub summary: String,
    pub remedies: Vec<Remedy>,
    /// What the step that died needed (or the run's peak), against the budget.
    #[serde(default)]
    pub need: super::need::Need,
    /// Memory on the device outside PyTorch's allocator at the OOM.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub outside: Option<super::need::Outside>,
    /// An inference KV cache at the OOM (or the end): its size per token, tokens, layers and
    /// sequences as far as the trace tells.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kv_cache: Option<super::kv::KvCache>,
}

pub use super::verdict::DiagnosisVerdict;

/// The remedies fragscope knows, by the name the JSON gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemedyKind {
    ExpandableSegments,
    Mempool,
    MaxSplitSize,
    ReuseBuffer,
    FixLeak,
    ActivationCheckpointing,
    SmallerBatch,
    ShardOptimizerState,
    LighterOptimizer,
    GradsSetToNone,
    ChunkedLoss,
    FewerSequences,
    ShorterGeneration,
    QuantizedCache,
    OffloadedCache,
    PagedServing,
}

impl RemedyKind {
    /// The remedy's title on the page.
    pub fn title(self) -> &'static str {
        match self {
            RemedyKind::ExpandableSegments => "Expandable segments",
            RemedyKind::Mempool => "A MemPool around the big allocations",
            RemedyKind::MaxSplitSize => "max_split_size_mb",
            RemedyKind::ReuseBuffer => "Reuse one buffer",
            RemedyKind::FixLeak => "Stop the leak",
            RemedyKind::ActivationCheckpointing => "Activation checkpointing",
            RemedyKind::SmallerBatch => "A smaller micro-batch",
            RemedyKind::ShardOptimizerState => "Shard the optimizer state",
            RemedyKind::LighterOptimizer => "A lighter optimizer",
            RemedyKind::GradsSetToNone => "Free gradients before the forward",
            RemedyKind::ChunkedLoss => "A chunked loss",
            RemedyKind::FewerSequences => "Fewer sequences at once",
            RemedyKind::ShorterGeneration => "Fewer new tokens",
            RemedyKind::QuantizedCache => "A quantized KV cache",
            RemedyKind::OffloadedCache => "An offloaded KV cache",
            RemedyKind::PagedServing => "A paged serving engine",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Remedy {
    pub kind: RemedyKind,
    pub applies: bool,
    pub setting_or_code: String,
    pub why: String,
    /// What the simulation predicts under this remedy, where it was run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted: Option<String>,
    /// The call site a code remedy acts on, as `--mempool`/`--reuse` take it.
    #[serde(skip)]
    pub site: Option<String>,
    /// What it would do to this run, in bytes, where that is known.
    #[serde(flatten)]
    pub fit: Fit,
}

impl Remedy {
    /// A remedy without a prediction or a call site yet.
    pub fn new(kind: RemedyKind, applies: bool, setting_or_code: String, why: String) -> Remedy {
        Remedy { kind, applies, setting_or_code, why, predicted: None, site: None, fit: Fit::default() }
    }
}

/// What a remedy would do: the page's badge follows `effect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The run would fit (no OOM within the budget, or a lower peak where there was no OOM).
    Fixes,
    /// It gets the run further than it really went, or saves memory, but not enough to fit.
    Helps,
    /// It applies, but the run would die as early or earlier.
    DoesNotHelp,
    /// It does not apply here, or would cost more than it saves.
    DoesNotApply,
}

impl Effect {
    /// The badge's words.
    pub fn label(self) -> &'static str {
        match self {
            Effect::Fixes => "fixes it",
            Effect::Helps => "helps, not enough",
            Effect::DoesNotHelp => "does not help",
            Effect::DoesNotApply => "does not apply",
        }
    }
}

/// A remedy's numbers: what it saves and the peak it predicts against the budget.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Fit {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub effect: Option<Effect>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub saves_bytes: Option<u64>,
    /// Predicted peak of reserved bytes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub predicted_peak_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub budget_bytes: Option<u64>,
    /// The prediction comes from replaying the trace through the allocator model with the
    /// remedy applied (else from arithmetic on what filled memory).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub simulated: Option<bool>,
    /// The share of today's micro-batch the prediction is for (`smaller_batch`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub batch_fraction: Option<f64>,
}

/// Everything the diagnosis weighs.
pub struct Facts<'a> {
    pub ooms: &'a [Oom],
    pub pinned: &'a Pinned,
    pub reserved_bytes: u64,
    pub rhythm: &'a Rhythm,
    pub rules: &'a Rules,
    /// The big allocations: their call site and size (the failing request, if any).
    pub big: Option<(Option<CallSite>, u64)>,
    /// How many times the big call site allocated that same rounded size.
    pub big_repeats: u64,
}

pub fn diagnose(f: &Facts) -> Diagnosis {
    let oom = f.ooms.first();
    let pinners = oom.map(|o| &o.pinners).unwrap_or(&f.pinned.pinners);
    let top = pinners.first();
    let small_size = top.map(|p| p.live_bytes / p.blocks.max(1)).unwrap_or(0);
    let fragmented = match oom {
        Some(o) => o.verdict == Verdict::Fragmentation,
        None => f.pinned.summary.bytes > 0 && f.pinned.summary.bytes * 10 >= f.reserved_bytes,
    };
    let mut summary = summary(f, oom);
    if f.rhythm.detected {
        summary.push_str(&format!(
            " {} segments were created one every {} events and stayed pinned: each step a big block was freed and a smaller, long-lived one took its place.",
            f.rhythm.pinned_segments,
            f.rhythm.period_events.unwrap_or(0)
        ));
    }
    let remedies = vec![
        expandable(f, fragmented),
        mempool(f, fragmented, top.and_then(|p| p.call_site.as_ref())),
        max_split(f, fragmented, small_size),
        reuse(f, fragmented),
    ];
    let verdict = match oom.map(|o| o.verdict) {
        Some(Verdict::Fragmentation) => DiagnosisVerdict::Fragmentation,
        Some(Verdict::Capacity) => DiagnosisVerdict::Capacity,
        None => DiagnosisVerdict::NoOom,
    };
    Diagnosis { verdict, summary, remedies, need: Default::default(), outside: None, kv_cache: None }
}

fn summary(f: &Facts, oom: Option<&Oom>) -> String {
    let pinned = &f.pinned.summary;
    let who = |pinners: &[super::gaps::Pinner]| match pinners.first().and_then(|p| p.call_site.as_ref().map(|c| (c, p)))
    {
        Some((site, p)) => format!(", {} of it by blocks allocated at {site}", bytes(p.pinned_free_bytes)),
        None => String::new(),
    };
    match oom {
        Some(o) if o.verdict == Verdict::Fragmentation => format!(
            "Out of memory at event {}, trying to allocate {}: {} was allocated and {} reserved but unallocated, enough for the request, but the largest free block it could use was {}: fragmentation. {} of free memory sat in segments pinned by live blocks{}.",
            o.event_index,
            torch_size(o.allocation_bytes),
            torch_size(o.allocated_bytes),
            torch_size(o.reserved_bytes - o.allocated_bytes),
            bytes(o.largest_usable_free_bytes),
            bytes(o.pinned_free_bytes),
            who(&o.pinners),
        ),
        Some(o) => format!(
            "Out of memory at event {}, trying to allocate {} (for a request of {}): {} was allocated and only {} reserved but unallocated, less than the request: capacity at the failing request.",
            o.event_index,
            torch_size(o.allocation_bytes),
            torch_size(o.requested_bytes),
            torch_size(o.allocated_bytes),
            torch_size(o.reserved_bytes - o.allocated_bytes),
        ),
        None if pinned.bytes > 0 => format!(
            "No OOM in this trace. At the end, {} of the {} reserved ({:.0}%) is free but pinned by live blocks in {} segments{}.",
            bytes(pinned.bytes),
            bytes(f.reserved_bytes),
            100.0 * pinned.bytes as f64 / f.reserved_bytes.max(1) as f64,
            pinned.segments,
            who(&f.pinned.pinners),
        ),
        None => "No OOM in this trace, and no free memory is pinned by live blocks at the end.".to_string(),
    }
}

fn expandable(f: &Facts, fragmented: bool) -> Remedy {
    let setting = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".to_string();
    let (applies, why) = if f.rules.expandable_segments {
        (false, "Expandable segments are already on.".to_string())
    } else if !fragmented && f.ooms.is_empty() {
        (false, "Little free memory is pinned here: there is no fragmentation for it to undo.".to_string())
    } else if !fragmented {
        (
            false,
            "The free memory is not what is missing: this run needs less memory, not less fragmentation.".to_string(),
        )
    } else {
        // Free memory that shares an expandable page with a live block stays mapped.
        let stuck: u64 = f.pinned.gaps.iter().map(|g| stuck_in_pages(g.address.0, g.size)).sum();
        let still = if stuck > 0 {
            format!(
                " Live blocks would still pin the pages they sit on: about {} of today's pinned free memory shares a page with a live block.",
                bytes(stuck)
            )
        } else {
            String::new()
        };
        (
            true,
            format!(
                "No code change. The allocator maps physical pages into one growing range per stream instead of separate segments, so memory freed anywhere can serve the next big request and whole free pages go back to CUDA.{still}"
            ),
        )
    };
    Remedy::new(RemedyKind::ExpandableSegments, applies, setting, why)
}

/// Bytes of a free range that do not fill whole expandable pages (2 MiB small, 20 MiB large).
fn stuck_in_pages(address: u64, size: u64) -> u64 {
    let page = if size <= SMALL_SIZE { SMALL_BUFFER } else { LARGE_BUFFER };
    let first = address.div_ceil(page) * page;
    let last = (address + size) / page * page;
    let whole = last.saturating_sub(first);
    size - whole.min(size)
}

fn mempool(f: &Facts, fragmented: bool, pinner: Option<&CallSite>) -> Remedy {
    let Some((Some(site), size)) = f.big.clone() else {
        let why = match f.big {
            Some((None, _)) => {
                "The big blocks carry no frames of their own (no stack recorded for them), so there is no call site to give a pool."
            }
            _ => "No large allocation stands out to give a pool of its own.",
        };
        return Remedy::new(RemedyKind::Mempool, false, String::new(), why.to_string());
    };
    let code = format!(
        "pool = torch.cuda.MemPool()  # once\nwith torch.cuda.use_mem_pool(pool):\n    ...  # the allocation at {}:{}, in {}",
        site.filename, site.line, site.name
    );
    let (applies, why) = if !fragmented {
        (false, "Nothing is fragmented enough for a private pool to help.".to_string())
    } else if pinner == Some(&site) {
        (
            false,
            format!(
                "The blocks that pin memory come from the same call site as the big ones ({site}): a pool around it would hold both."
            ),
        )
    } else {
        let by = pinner.map(|p| format!(" (the small long-lived blocks come from {p})")).unwrap_or_default();
        (
            true,
            format!(
                "The {} blocks allocated at {site} share segments with blocks that outlive them{by}. In a private pool they get segments of their own, so a freed big block is whole again for the next big request.",
                bytes(size)
            ),
        )
    };
    Remedy { site: Some(crate::simulate::site_arg(&site)), ..Remedy::new(RemedyKind::Mempool, applies, code, why) }
}

fn max_split(f: &Facts, fragmented: bool, small_size: u64) -> Remedy {
    let big = f.big.as_ref().map(|b| b.1).unwrap_or(0);
    // Just under the big blocks, so they are never split, but at least 20 (torch's minimum).
    let n = (big.saturating_sub(1) / MIB).max(20);
    let setting = format!("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{n}");
    let (applies, why) = if f.rules.expandable_segments {
        (false, "With expandable segments on, max_split_size has no effect.".to_string())
    } else if !fragmented || big <= SMALL_SIZE {
        (false, "No big block is being split by smaller requests.".to_string())
    } else if f.rules.max_split_size_mb().is_some_and(|m| m <= n) {
        (false, format!("max_split_size_mb is already {}.", f.rules.max_split_size_mb().unwrap_or(0)))
    } else if small_size >= n * MIB {
        (
            false,
            format!("The pinning blocks ({}) are as big as the split blocks: no N separates them.", bytes(small_size)),
        )
    } else {
        (
            true,
            format!(
                "Cached blocks of {n} MiB or more are never split, so requests under {n} MiB (such as the {} blocks that pin memory today) stop landing inside freed {} blocks. The cost: big requests take only cached blocks less than 20 MiB larger than themselves and small ones need segments of their own, so more memory is reserved.",
                bytes(small_size),
                bytes(big)
            ),
        )
    };
    Remedy::new(RemedyKind::MaxSplitSize, applies, setting, why)
}

fn reuse(f: &Facts, fragmented: bool) -> Remedy {
    let Some((site, size)) = f.big.clone() else {
        return Remedy::new(RemedyKind::ReuseBuffer, false, String::new(), "No big allocation to reuse.".into());
    };
    let place = site.as_ref().map(|s| format!("{s}")).unwrap_or_else(|| "The big allocation's call site".into());
    let code = format!(
        "buf = torch.empty({size}, dtype=torch.uint8, device=\"cuda\")  # once, {}\nx = buf[:{size}].view(dtype).view(shape)  # or torch.op(..., out=...)\n# each time, instead of allocating at {place}",
        bytes(size)
    );
    let (applies, why) = if f.big_repeats >= 3 && fragmented {
        (
            true,
            format!(
                "{place} allocated {} {} times. One buffer allocated once and reused never leaves a hole to fill.",
                bytes(size),
                f.big_repeats
            ),
        )
    } else if f.big_repeats >= 3 {
        (
            false,
            format!(
                "{place} allocated {} {} times, but that is not what runs out of memory here.",
                bytes(size),
                f.big_repeats
            ),
        )
    } else {
        let times = match f.big_repeats {
            0 => "outside the trace".to_string(),
            1 => "once in the trace".to_string(),
            n => format!("only {n} times in the trace"),
        };
        (false, format!("{place} allocated {} {times}: there is no repeated allocation to reuse.", bytes(size)))
    };
    Remedy {
        site: site.as_ref().map(crate::simulate::site_arg),
        ..Remedy::new(RemedyKind::ReuseBuffer, applies, code, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stuck_bytes_are_what_does_not_fill_whole_pages() {
        let page = LARGE_BUFFER;
        assert_eq!(stuck_in_pages(page, 3 * page), 0);
        // [page + 1 KiB, 3 pages + 1 KiB) holds one whole page: the rest is stuck.
        assert_eq!(stuck_in_pages(page + 1024, 2 * page), page);
        assert_eq!(stuck_in_pages(page / 2, page), page, "half a page on each side, no whole page");
    }
}
