//! What the step that died needed, against real reruns of the same jobs (`tests/fixtures/jobs`,
//! from `../shared/fixtures/real`): each OOM snapshot's job run again with no budget (what the
//! step really needed), at half the batch under the budget, and with Adafactor under it. A
//! remedy's promise is checked against what its rerun really did. Expected values come from
//! the truth files only.

use serde_json::Value;

use crate::util::*;

fn jobs() -> std::path::PathBuf {
    fixtures().join("jobs")
}

fn job_truth(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(jobs().join(format!("{name}.truth.json"))).unwrap()).unwrap()
}

fn job_analysis(name: &str) -> Value {
    analyze_json(&jobs().join(format!("{name}.pickle.zst")))
}

/// An OOM snapshot and the reruns of its job: (no budget, half the batch, Adafactor). GPT-2
/// jobs from `../shared`, and a Llama job made the same way (`tests/gpu/gen_more_jobs.py`).
const LADDER: [(&str, &str, &str, &str); 7] = [
    ("ladder_b24_oom", "free_b24", "ladder_b12", "ladder_b24_adafactor"),
    ("ladder_b12b24_oom", "free_b24", "ladder_b12", "ladder_b24_adafactor"),
    ("ladder_b20_oom", "free_b20", "ladder_b10", "ladder_b20_adafactor"),
    ("step2_b8_oom", "step2_free_b8", "step2_b4", "step2_b8_adafactor"),
    ("llama_b16_oom", "llama_free_b16", "llama_b8", "llama_b16_adafactor"),
    ("llama_b8b16_oom", "llama_free_b16", "llama_b8", "llama_b16_adafactor"),
    ("llama_s2_b16_oom", "llama_free_b16", "llama_s2_b8", "llama_s2_b16_adafactor"),
];

/// The Llama jobs' gradient-checkpointing reruns (the GPT-2 ones did not complete).
const CHECKPOINTED: [(&str, &str); 3] = [
    ("llama_b16_oom", "llama_b16_ckpt"),
    ("llama_b8b16_oom", "llama_b16_ckpt"),
    ("llama_s2_b16_oom", "llama_s2_b16_ckpt"),
];

fn within(got: u64, want: u64, pct: f64) -> bool {
    (got as f64 - want as f64).abs() <= pct / 100.0 * want as f64
}

fn remedy<'a>(d: &'a Value, kind: &str) -> Option<&'a Value> {
    d["diagnosis"]["remedies"].as_array().unwrap().iter().find(|r| r["kind"] == kind)
}

/// The peak the rerun reached in the step that died (its steps' peaks where it lists them).
fn rerun_peaks(free: &Value, step: usize) -> (u64, u64) {
    let info = &free["info"];
    match info["step_peaks_allocated_reserved"].as_array().and_then(|p| p.get(step.max(1))) {
        Some(p) => (p[0].as_u64().unwrap(), p[1].as_u64().unwrap()),
        None => (info["max_allocated"].as_u64().unwrap(), info["max_reserved"].as_u64().unwrap()),
    }
}

#[test]
fn the_need_of_the_step_that_died_is_within_15_percent_of_its_rerun_without_a_budget() {
    for (oom, free, _, _) in LADDER {
        let (truth, free) = (job_truth(oom), job_truth(free));
        assert!(
            free["info"]["budget_bytes"].is_null() && free["info"]["oom"].is_null(),
            "{oom}: the rerun had no budget"
        );
        let step = truth["info"]["step_at_oom"].as_u64().unwrap() as usize;
        let (allocated, reserved) = rerun_peaks(&free, step);
        let d = &job_analysis(oom)["devices"][0];
        let need = &d["diagnosis"]["need"];
        let got = (need["peak_allocated_bytes"].as_u64().unwrap(), need["peak_reserved_bytes"].as_u64().unwrap());
        assert!(within(got.0, allocated, 15.0), "{oom}: need {} allocated, the rerun {allocated}", got.0);
        assert!(within(got.1, reserved, 15.0), "{oom}: need {} reserved, the rerun {reserved}", got.1);
        assert!(need["basis"].as_str().unwrap().len() > 40, "{oom}: {need}");
        // The budget the job had: the projection's bounds hold it.
        let budget = truth["info"]["budget_bytes"].as_u64().unwrap();
        let low = need["budget_bytes"].as_u64().unwrap();
        let high = need["budget_upper_bytes"].as_u64().unwrap_or(low);
        assert!(low <= budget && budget <= high, "{oom}: budget {budget} outside [{low}, {high}]");
    }
}

#[test]
fn a_step_that_needs_more_than_its_budget_is_capacity_and_no_allocator_setting_fixes_it() {
    for (oom, free, _, _) in LADDER {
        let (truth, free) = (job_truth(oom), job_truth(free));
        let step = truth["info"]["step_at_oom"].as_u64().unwrap() as usize;
        assert!(rerun_peaks(&free, step).0 > truth["info"]["budget_bytes"].as_u64().unwrap(), "{oom}");
        let d = &job_analysis(oom)["devices"][0];
        assert_eq!(d["diagnosis"]["verdict"], "capacity", "{oom}");
        assert_eq!(d["diagnosis"]["need"]["fits"], false, "{oom}");
        for kind in ["expandable_segments", "max_split_size", "mempool", "reuse_buffer"] {
            if let Some(r) = remedy(d, kind) {
                assert_ne!(r["effect"], "fixes", "{oom}: {kind} cannot fit a step that needs more than the budget");
            }
        }
    }
}

#[test]
fn half_the_batch_is_predicted_to_fix_and_to_peak_within_15_percent_of_its_rerun() {
    for (oom, _, half, _) in LADDER {
        let half = job_truth(half);
        assert!(half["info"]["oom"].is_null(), "{oom}: the half-batch rerun fit");
        let d = &job_analysis(oom)["devices"][0];
        let r = remedy(d, "smaller_batch").unwrap_or_else(|| panic!("{oom}: no smaller_batch"));
        assert_eq!(r["effect"], "fixes", "{oom}: {r}");
        assert_eq!(r["batch_fraction"], 0.5, "{oom}: half the batch is what fits first");
        let want = half["info"]["max_reserved"].as_u64().unwrap();
        let got = r["predicted_peak_bytes"].as_u64().unwrap();
        assert!(within(got, want, 15.0), "{oom}: half the batch predicted {got}, the rerun peaked at {want}");
    }
}

#[test]
fn a_lighter_optimizer_fixes_exactly_where_the_adafactor_rerun_fit() {
    for (oom, _, _, adafactor) in LADDER {
        let fit = job_truth(adafactor)["info"]["oom"].is_null();
        let d = &job_analysis(oom)["devices"][0];
        let r = remedy(d, "lighter_optimizer");
        let fixes = r.is_some_and(|r| r["effect"] == "fixes");
        assert_eq!(fixes, fit, "{oom}: the Adafactor rerun {}: {r:?}", if fit { "fit" } else { "still ran out" });
    }
}

#[test]
fn checkpointing_is_predicted_to_fix_and_to_peak_within_15_percent_of_its_rerun() {
    for (oom, ckpt) in CHECKPOINTED {
        let ckpt = job_truth(ckpt);
        assert!(ckpt["info"]["oom"].is_null() && ckpt["info"]["checkpointing"] == true, "{oom}");
        let d = &job_analysis(oom)["devices"][0];
        let r = remedy(d, "activation_checkpointing").unwrap_or_else(|| panic!("{oom}: no checkpointing"));
        assert_eq!(r["effect"], "fixes", "{oom}: {r}");
        let (got, want) = (r["predicted_peak_bytes"].as_u64().unwrap(), ckpt["info"]["max_reserved"].as_u64().unwrap());
        assert!(within(got, want, 15.0), "{oom}: checkpointing predicted {got}, the rerun peaked at {want}");
        // The layer to wrap is the decoder layer the model's loop calls, not the user's line.
        let layers = &d["diagnosis"]["need"]["layers"];
        assert!(layers["call_site"]["filename"].as_str().unwrap().ends_with("llama/modeling_llama.py"), "{layers}");
        assert_eq!(layers["calls"], ckpt["info"]["model"]["layers"], "{layers}");
    }
}

#[test]
fn a_first_step_oom_names_its_forward_activations_and_the_layer_to_checkpoint() {
    let d = &job_analysis("ladder_b24_oom")["devices"][0];
    let oom = d["breakdown"].as_array().unwrap().iter().find(|b| b["moment"] == "oom").unwrap();
    let (act, all) = (oom["categories"]["activation"].as_u64().unwrap(), oom["allocated_bytes"].as_u64().unwrap());
    assert!(act * 10 >= all * 8, "activations {act} of {all} at a first-step OOM");
    assert!(oom["categories"]["unknown"].as_u64().unwrap() * 100 < all, "{oom}");
    let layers = &d["diagnosis"]["need"]["layers"];
    let ladder: Value = serde_json::from_slice(&std::fs::read(jobs().join("ladder.json")).unwrap()).unwrap();
    assert_eq!(layers["calls"], ladder["model"]["layers"], "{layers}");
    // The model's own loop over its layers (GPT-2's, in transformers), not the user's line.
    assert!(layers["call_site"]["filename"].as_str().unwrap().ends_with("gpt2/modeling_gpt2.py"), "{layers}");
    let r = remedy(d, "activation_checkpointing").unwrap();
    assert!(r["setting_or_code"].as_str().unwrap().contains("gradient_checkpointing_enable"), "{r}");
}

#[test]
fn every_oom_reports_what_the_device_held_outside_pytorch_as_far_as_it_can_tell() {
    let d = &job_analysis("ladder_b24_oom")["devices"][0];
    let outside = &d["diagnosis"]["outside"];
    assert_eq!(outside["device_free_bytes"], d["ooms"][0]["device_free_bytes"]);
    assert!(outside["outside_bytes"].is_null(), "no device total recorded: {outside}");
    // torch's message: "GPU 0 has a total capacity of 139.80 GiB of which 82.47 GiB is free.
    // Including non-PyTorch memory, this process has 57.32 GiB memory in use."
    let msg = job_truth("ladder_b24_oom")["info"]["oom"].as_str().unwrap().to_string();
    let gib = |marker: &str| -> f64 {
        let head = &msg[..msg.find(marker).unwrap()];
        head.split_whitespace().next_back().unwrap().parse::<f64>().unwrap()
    };
    let total = (gib("GiB of which") * (1u64 << 30) as f64) as u64;
    let out = std::process::Command::new(bin())
        .args(["analyze", "--json", "--device-total", &total.to_string()])
        .arg(jobs().join("ladder_b24_oom.pickle.zst"))
        .output()
        .unwrap();
    let a: Value = serde_json::from_slice(&out.stdout).unwrap();
    let outside = &a["devices"][0]["diagnosis"]["outside"];
    let in_use = gib("GiB memory in use") * (1u64 << 30) as f64;
    let reserved = outside["reserved_bytes"].as_u64().unwrap() as f64;
    // What the process held besides PyTorch's reservation, to the message's two decimals (no
    // other process ran on that GPU).
    let got = outside["outside_bytes"].as_u64().unwrap() as f64;
    assert!((got - (in_use - reserved)).abs() < 0.02 * (1u64 << 30) as f64, "{outside}, in use {in_use}");
}

/// A badge says what the replay said: a remedy whose replay dies no later than the real run
/// is "does not help", never "helps, not enough"; one that dies later "helps". Where the real
/// rerun with Adafactor died too (truth), the lighter optimizer is one of those that did not fix it.
#[test]
fn a_remedy_whose_replay_dies_no_later_than_the_run_does_not_help() {
    let mut seen = 0;
    for (oom, _, _, adafactor) in LADDER {
        let d = &job_analysis(oom)["devices"][0];
        for r in d["diagnosis"]["remedies"].as_array().unwrap() {
            let predicted = r["predicted"].as_str().unwrap_or("");
            if predicted.contains(", no later than the real run") {
                assert_eq!(r["effect"], "does_not_help", "{oom}: {r}");
                seen += 1;
            } else if predicted.contains(", later than the real run") {
                assert_eq!(r["effect"], "helps", "{oom}: {r}");
            }
        }
        if !job_truth(adafactor)["info"]["oom"].is_null()
            && let Some(r) = remedy(d, "lighter_optimizer")
        {
            assert_ne!(r["effect"], "fixes", "{oom}: the Adafactor rerun died too: {r}");
        }
    }
    assert!(seen > 0, "no ladder job has a remedy whose replay dies no later: the rule is untested");
}
