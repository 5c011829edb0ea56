//! Remedies for a run without a backward (inference, `generate`), each with its numbers from
//! the projected peak as [`super::capacity`] weighs the training ones:
//! - `fewer_sequences`: the KV cache, activations and the other batch-sized memory shrink with
//!   the sequences decoded together: the largest share of them that fits.
//! - `shorter_generation`: the cache grows by `bytes_per_token`; the tokens the budget leaves
//!   room for (prompt and new tokens together).
//! - `quantized_cache`: 4-bit keys and values, a quarter of 16-bit ones.
//! - `offloaded_cache`: the layer computing and the next one on the GPU, the rest on the CPU.
//! - `paged_serving`: for many sequences, no numbers (it depends on how long each one runs).

use super::advice::{Remedy, RemedyKind};
use super::capacity::Facts;
use super::need::{Change, Mix};
use crate::units::bytes;

/// The inference remedies, in no order (the caller sorts by saving).
pub fn remedies(f: &Facts, at: &Mix, moment: &str) -> Vec<Remedy> {
    let mut out = Vec::new();
    out.extend(fewer_sequences(f, at, moment));
    let Some(kv) = f.kv else { return out };
    if let (Some(per_token), Some(tokens)) = (kv.bytes_per_token, kv.tokens) {
        let share = |t: u64| t as f64 / tokens.max(1) as f64;
        let fit = (1..tokens).rev().find(|t| f.fits(&Change { kv_cache: share(*t), ..Change::NONE }));
        if let Some(t) = fit {
            out.extend(f.weigh(
                RemedyKind::ShorterGeneration,
                Change { kv_cache: share(t), ..Change::NONE },
                format!(
                    "# the prompt and the new tokens together at most {t} tokens:\nmodel.generate(input_ids, max_new_tokens={t} - input_ids.shape[1])"
                ),
                format!(
                    "The KV cache grows {} a token ({} layers{}); it held {tokens} tokens, {} {moment}. The budget leaves room for {t} tokens.",
                    bytes(per_token),
                    kv.layers.map_or("?".into(), |l| l.to_string()),
                    kv.sequences.map_or(String::new(), |s| format!(", {s} sequences")),
                    bytes(at.kv_cache)
                ),
            ));
        }
    }
    out.extend(f.weigh(
        RemedyKind::QuantizedCache,
        Change { kv_cache: 0.25, ..Change::NONE },
        "model.generate(input_ids, cache_implementation=\"quantized\",\n               cache_config={\"backend\": \"quanto\", \"nbits\": 4})".into(),
        format!(
            "{} of KV cache {moment}; 4-bit keys and values take a quarter of 16-bit ones (counted so here; the scales add a little).",
            bytes(at.kv_cache)
        ),
    ));
    if let Some(layers) = kv.layers.filter(|l| *l > 2) {
        out.extend(f.weigh(
            RemedyKind::OffloadedCache,
            Change { kv_cache: 2.0 / layers as f64, ..Change::NONE },
            "model.generate(input_ids, cache_implementation=\"offloaded\")\n# or cache_implementation=\"static\": the whole length allocated once, no block copied each token (no less memory)".into(),
            format!(
                "{} of KV cache over {layers} layers {moment}; offloaded, only the layer computing and the next one's are on the GPU (counted so here; slower: each token copies the cache over PCIe).",
                bytes(at.kv_cache)
            ),
        ));
    }
    if kv.sequences.is_none_or(|s| s > 1) {
        let mut r = Remedy::new(
            RemedyKind::PagedServing,
            true,
            "# vLLM (or SGLang, TGI): the cache in pages, sequences batched as they come and go\nfrom vllm import LLM, SamplingParams\nLLM(model=path).generate(prompts, SamplingParams(max_tokens=n))".into(),
            "Many sequences at once: a paged engine gives each sequence pages for the tokens it really has, not a block per layer copied one token longer each step, and frees a finished sequence's pages at once.".into(),
        );
        r.fit.effect = None;
        out.push(r);
    }
    out
}

fn fewer_sequences(f: &Facts, at: &Mix, moment: &str) -> Option<Remedy> {
    let change = |share: f64| Change { batch: share, ..Change::NONE };
    let (n, largest) = f.batch_shares();
    let sequences = f.kv.and_then(|k| k.sequences);
    let fits = match (largest, sequences) {
        (Some(p), Some(s)) => {
            format!(" Up to {} of today's {s} sequences at once fit the budget.", (s * p / 100).max(1))
        }
        (Some(p), None) => format!(" Up to {p}% of today's batch fits the budget."),
        (None, _) => " Even a hundredth of the batch would not fit: the rest of the memory is too much.".into(),
    };
    let code = match sequences {
        Some(s) => format!(
            "# {} sequences at a time instead of {s}:\nfor part in input_ids.split({}):\n    out = model.generate(part, ...)",
            (s / n as u64).max(1),
            (s / n as u64).max(1)
        ),
        None => format!("# 1/{n} of the batch at a time:\nfor part in batch.chunk({n}):\n    out = model(part)"),
    };
    let why = format!(
        "The KV cache and the other per-sequence memory ({} {moment}) shrink with the sequences run together.{fits}",
        bytes(at.kv_cache + at.activation + at.batch)
    );
    let mut r = f.weigh(RemedyKind::FewerSequences, change(1.0 / n as f64), code, why)?;
    r.fit.batch_fraction = Some(1.0 / n as f64);
    Some(r)
}
