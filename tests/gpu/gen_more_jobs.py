"""More real snapshots for fragscope's checks, on another model family (Llama, built from a config, saved and
loaded with from_pretrained(device_map="cuda") as users load checkpoints): a capacity ladder with real reruns
(no budget, half batch, gradient checkpointing, Adafactor), a step-2 OOM ladder, eval loops that keep
outputs, a KV-cache OOM in generate, and Lightning / PEFT LoRA / FSDP2 runs with category truth.

Truth files follow ../shared/tools/gen_framework_snapshots.py. Each scenario runs in its own process.
Usage: python3 gen_more.py OUTDIR [scenario ...]
"""
import json
import os
import pickle
import subprocess
import sys
import time
import traceback

MiB = 1 << 20
GiB = 1 << 30
SEQ = 1024
LLAMA = dict(d=2048, layers=16, heads=16, inter=5504, vocab=32000)
SAVED = "/tmp/llama_saved"


def llama_cfg(d, layers, heads, inter, vocab):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=d, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=heads, vocab_size=vocab, max_position_embeddings=4096)


def llama(torch, d=1024, layers=8, heads=16, inter=2816, vocab=32000, device="cuda", dtype=None):
    from transformers import LlamaForCausalLM
    m = LlamaForCausalLM(llama_cfg(d, layers, heads, inter, vocab))
    if dtype is not None:
        m = m.to(dtype)
    return m.to(device), vocab


def saved_llama(torch):
    """The ladder's model, loaded as users load a checkpoint."""
    from transformers import LlamaForCausalLM
    m = LlamaForCausalLM.from_pretrained(SAVED, device_map="cuda", dtype=torch.float32)
    m.train()
    return m, LLAMA["vocab"]


def blocks_of(tensors):
    out, seen = [], set()
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        if not getattr(t, "is_cuda", False):
            continue
        s = t.untyped_storage()
        if s.data_ptr() in seen or s.nbytes() == 0:
            continue
        seen.add(s.data_ptr())
        out.append([hex(s.data_ptr()), s.nbytes()])
    return out


def categories(params, opt):
    params = list(params)
    inner = getattr(opt, "optimizer", opt) if opt is not None else None
    states = []
    if inner is not None:
        for st in inner.state.values():
            for v in st.values():
                if hasattr(v, "is_cuda") or hasattr(v, "to_local"):
                    states.append(v)
    return {"parameter": blocks_of(params), "gradient": blocks_of([p.grad for p in params]),
            "optimizer_state": blocks_of(states)}


def dump(torch, out, name):
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(os.path.join(out, name + ".pickle"))


# --- the ladder ------------------------------------------------------------------------------------------------
def cap_run(torch, out, name, batches, budget, ckpt=False, optim="adamw", snapshot=False):
    if budget:
        torch.cuda.set_per_process_memory_fraction(budget / torch.cuda.get_device_properties(0).total_memory)
    torch.manual_seed(236)
    model, vocab = saved_llama(torch)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    opt = (torch.optim.Adafactor(model.parameters(), lr=1e-3) if optim == "adafactor"
           else torch.optim.AdamW(model.parameters(), lr=1e-4))
    path = os.path.join(out, name + ".pickle")
    seen, phase = {}, {"now": "setup", "step": -1}

    def observer(device, alloc, device_alloc, device_free):
        if seen or not snapshot:
            return
        with open(path, "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
        seen["categories"] = categories(model.parameters(), opt)
        seen["stats_at_dump"] = torch.cuda.memory_stats()
        seen["phase_at_oom"] = phase["now"]
        seen["step_at_oom"] = phase["step"]

    torch._C._cuda_attach_out_of_memory_observer(observer)
    oom, survived, step_peaks = None, 0, []
    try:
        for step, b in enumerate(batches):
            torch.cuda.reset_peak_memory_stats()
            phase["step"] = step
            idx = torch.randint(0, vocab, (b, SEQ), device="cuda")
            phase["now"] = "forward"
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=idx, labels=idx).loss
            phase["now"] = "backward"
            loss.backward()
            phase["now"] = "optimizer"
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss, idx
            survived = step + 1
            step_peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
    except torch.OutOfMemoryError as e:
        oom = str(e).splitlines()[0]
    torch.cuda.synchronize()
    res = {"family": "llama", "model": LLAMA, "seq": SEQ, "batches": batches,
           "step_peaks_allocated_reserved": step_peaks, "budget_bytes": budget, "checkpointing": ckpt,
           "optimizer": optim, "set_to_none": True, "oom": oom, "steps_survived": survived,
           "max_allocated": max([p[0] for p in step_peaks] + [torch.cuda.max_memory_allocated()]),
           "max_reserved": max([p[1] for p in step_peaks] + [torch.cuda.max_memory_reserved()]),
           "params": sum(p.numel() for p in model.parameters()),
           "device_total_bytes": torch.cuda.get_device_properties(0).total_memory}
    if snapshot:
        if not seen:
            torch.cuda.memory._dump_snapshot(path)
            seen["stats_at_dump"] = torch.cuda.memory_stats()
        res.update(seen)
        res["dumped_early"] = True
    return res


FREE = {"llama_free_b8": dict(batches=[8, 8, 8]), "llama_free_b16": dict(batches=[16, 16, 16])}
# budget1 sits between the two free runs' peaks: batch 16 cannot fit, batch 8 can
LADDER1 = {"llama_b16_oom": dict(batches=[16, 16, 16], snapshot=True),
           "llama_b8b16_oom": dict(batches=[8, 8, 16], snapshot=True),
           "llama_b8": dict(batches=[8, 8, 8]),
           "llama_b16_ckpt": dict(batches=[16, 16, 16], ckpt=True),
           "llama_b16_adafactor": dict(batches=[16, 16, 16], optim="adafactor")}
# budget2 sits between free_b16's first step and its later steps (the optimizer state)
LADDER2 = {"llama_s2_b16_oom": dict(batches=[16, 16, 16], snapshot=True),
           "llama_s2_b8": dict(batches=[8, 8, 8]),
           "llama_s2_b16_ckpt": dict(batches=[16, 16, 16], ckpt=True),
           "llama_s2_b16_adafactor": dict(batches=[16, 16, 16], optim="adafactor")}


# --- loops without an optimizer, inference, frameworks ----------------------------------------------------------
def eval_keeps_logits(torch, out, name):
    """An evaluation loop under no_grad that keeps every forward's logits in a list: ~1 GiB per forward.
    Truth: allocated after each forward."""
    torch.manual_seed(240)
    model, vocab = llama(torch, d=1024, layers=8, heads=16, inter=2816, vocab=32000)
    model.eval()
    outs, after = [], []
    with torch.no_grad():
        for i in range(12):
            idx = torch.randint(0, vocab, (8, SEQ), device="cuda")
            logits = model(input_ids=idx, use_cache=False).logits
            outs.append(logits)  # the leak: every forward's logits are kept
            torch.cuda.synchronize()
            after.append(torch.cuda.memory_allocated())
    growth = [b - a for a, b in zip(after, after[1:])]
    return {"forwards": 12, "allocated_after_forward": after, "growth_per_forward": growth,
            "leak": True, "no_grad": True, "_keep": [outs]}


def eval_keeps_loss_graph(torch, out, name):
    """An evaluation loop that forgot torch.no_grad() and keeps each loss tensor: each forward's autograd graph
    and its saved activations stay alive."""
    torch.manual_seed(241)
    model, vocab = llama(torch, d=1024, layers=8, heads=16, inter=2816, vocab=32000)
    model.eval()
    losses, after = [], []
    for i in range(10):
        idx = torch.randint(0, vocab, (4, SEQ), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=idx, labels=idx, use_cache=False).loss
        losses.append(loss)  # the leak: the loss holds its graph
        torch.cuda.synchronize()
        after.append(torch.cuda.memory_allocated())
    growth = [b - a for a, b in zip(after, after[1:])]
    return {"forwards": 10, "allocated_after_forward": after, "growth_per_forward": growth,
            "leak": True, "no_grad": False, "_keep": [losses]}


def eval_healthy(torch, out, name):
    """A healthy evaluation loop: no_grad, only .item() kept. No growth."""
    torch.manual_seed(242)
    model, vocab = llama(torch, d=1024, layers=8, heads=16, inter=2816, vocab=32000)
    model.eval()
    total, after = 0.0, []
    with torch.no_grad():
        for i in range(12):
            idx = torch.randint(0, vocab, (8, SEQ), device="cuda")
            total += model(input_ids=idx, labels=idx, use_cache=False).loss.item()
            after.append(torch.cuda.memory_allocated())
    return {"forwards": 12, "allocated_after_forward": after, "leak": False}


def kv_cache_oom_llama(torch, out, name):
    """Greedy generation (bf16 Llama d=2048, 16 layers, batch 16) under weights + 4 GiB: the KV cache grows
    until a capacity OOM. Snapshot by an OOM observer."""
    torch.manual_seed(243)
    model, vocab = llama(torch, d=2048, layers=16, heads=16, inter=5504, vocab=32000, dtype=torch.bfloat16)
    model.eval()
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = pbytes + 4 * GiB
    torch.cuda.set_per_process_memory_fraction(budget / torch.cuda.get_device_properties(0).total_memory)
    path = os.path.join(out, name + ".pickle")
    seen = {}

    def observer(device, alloc, device_alloc, device_free):
        if not seen:
            with open(path, "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)
            seen["stats_at_dump"] = torch.cuda.memory_stats()
            seen["categories"] = categories(model.parameters(), None)

    torch._C._cuda_attach_out_of_memory_observer(observer)
    oom, n = None, 0
    batch, prompt = 16, 128
    idx = torch.randint(0, vocab, (batch, prompt), device="cuda")
    try:
        with torch.no_grad():
            outp = model.generate(idx, max_new_tokens=3900, min_new_tokens=3900, do_sample=False)
            n = outp.shape[1] - prompt
    except torch.OutOfMemoryError as e:
        oom = str(e).splitlines()[0]
    if not seen:
        torch.cuda.memory._dump_snapshot(path)
        seen["stats_at_dump"] = torch.cuda.memory_stats()
    kv_per_token = 2 * 16 * batch * 2048 * 2
    return {"dumped_early": True, "oom": oom, "generated": n, "budget_bytes": budget, "param_bytes": pbytes,
            "batch": batch, "prompt": prompt, "layers": 16, "kv_cache_bytes_per_token": kv_per_token, **seen}


def lightning_llama(torch, out, name):
    """Lightning (bf16-mixed, AdamW) on a Llama: dumped in on_before_optimizer_step of the 4th step."""
    try:
        import lightning as L
    except ImportError:
        import pytorch_lightning as L
    torch.manual_seed(244)
    model, vocab = llama(torch, d=1024, layers=6, heads=16, inter=2816, device="cpu")
    got = {}

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, i):
            return self.net(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Dump(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if trainer.global_step == 3 and not got:
                got["categories"] = categories(pl_module.parameters(), optimizer)
                got["stats_at_dump"] = torch.cuda.memory_stats()
                dump(torch, out, name)

    data = torch.utils.data.DataLoader([torch.randint(0, vocab, (512,)) for _ in range(64)], batch_size=8)
    L.Trainer(accelerator="cuda", devices=1, max_steps=6, precision="bf16-mixed", logger=False,
              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
              callbacks=[Dump()]).fit(Module(), data)
    return {"dumped_early": True, "family": "llama", "when": "Lightning, 4th step, on_before_optimizer_step", **got}


def lora_llama(torch, out, name):
    """PEFT LoRA on a bf16 Llama (d=2048, 12 layers), adapters on q_proj/v_proj: dumped after the 4th backward."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(245)
    base, vocab = llama(torch, d=2048, layers=12, heads=16, inter=5504, dtype=torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                            target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for step in range(4):
        idx = torch.randint(0, vocab, (4, SEQ), device="cuda")
        loss = model(input_ids=idx, labels=idx).loss
        loss.backward()
        if step == 3:
            cats = categories(model.parameters(), opt)
            cats["input"] = blocks_of([idx])
            stats = torch.cuda.memory_stats()
            dump(torch, out, name)
            return {"dumped_early": True, "family": "llama", "stats_at_dump": stats, "categories": cats,
                    "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
                    "frozen_params": sum(p.numel() for p in model.parameters() if not p.requires_grad),
                    "when": "after the 4th backward, before its optimizer step"}
        opt.step()
        opt.zero_grad(set_to_none=True)


def fsdp2_llama(torch, out, name):
    """FSDP2 (fully_shard per decoder layer and the root), world size 1, on a Llama: dumped after the 4th
    backward."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29545", rank=0, world_size=1)
    torch.manual_seed(246)
    model, vocab = llama(torch, d=1024, layers=8, heads=16, inter=2816)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    try:
        for step in range(4):
            idx = torch.randint(0, vocab, (8, SEQ), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=idx, labels=idx).loss
            loss.backward()
            if step == 3:
                cats = categories(model.parameters(), opt)
                cats["input"] = blocks_of([idx])
                stats = torch.cuda.memory_stats()
                dump(torch, out, name)
                return {"dumped_early": True, "family": "llama", "stats_at_dump": stats, "categories": cats,
                        "when": "FSDP2, after the 4th backward, before its optimizer step"}
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        dist.destroy_process_group()


FUNCS = {"llama_eval_keeps_logits": eval_keeps_logits, "llama_eval_keeps_graph": eval_keeps_loss_graph,
         "llama_eval_healthy": eval_healthy, "llama_infer_kv_oom": kv_cache_oom_llama,
         "llama_fw_lightning": lightning_llama, "llama_fw_lora": lora_llama, "llama_fw_fsdp2": fsdp2_llama}
MAX_ENTRIES = {"llama_infer_kv_oom": 400_000}


def run_one(name, outdir, budget=None):
    import torch
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES.get(name, 300_000), stacks="python")
    t0 = time.time()
    spec = FREE.get(name) or LADDER1.get(name) or LADDER2.get(name)
    if spec is not None:
        info = cap_run(torch, outdir, name, budget=None if name in FREE else budget, **spec)
    else:
        info = FUNCS[name](torch, outdir, name)
    elapsed = time.time() - t0
    path = os.path.join(outdir, name + ".pickle")
    keep = name in FUNCS or (spec is not None and spec.get("snapshot"))
    if keep and not info.get("dumped_early"):
        torch.cuda.memory._dump_snapshot(path)
        stats = torch.cuda.memory_stats()
    else:
        stats = info.pop("stats_at_dump", None) or torch.cuda.memory_stats()
    info.pop("_keep", None)
    torch.cuda.memory._record_memory_history(None)
    truth = {"scenario": name, "torch": torch.__version__, "cuda": torch.version.cuda,
             "device": torch.cuda.get_device_name(0), "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
             "stacks": "python", "run_seconds": round(elapsed, 3),
             "pickle_bytes": os.path.getsize(path) if keep and os.path.exists(path) else 0, "info": info,
             "memory_stats": stats}
    with open(os.path.join(outdir, name + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=1, sort_keys=True)
    print(f"{name}: oom={bool(info.get('oom'))} survived={info.get('steps_survived')} "
          f"peak_res={stats['reserved_bytes.all.peak']/MiB:.0f}MiB peak_alloc={stats['allocated_bytes.all.peak']/MiB:.0f}MiB "
          f"peaks={[[round(x / GiB, 2) for x in p] for p in info.get('step_peaks_allocated_reserved', [])]} "
          f"run={elapsed:.1f}s", flush=True)


def spawn(outdir, name, budget=None, timeout=240):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    cmd = [sys.executable, __file__, outdir, "--one", name] + ([str(budget)] if budget else [])
    try:
        r = subprocess.run(cmd, env=env, timeout=timeout)
        if r.returncode != 0:
            print(f"{name}: FAILED rc={r.returncode}", flush=True)
    except subprocess.TimeoutExpired:
        print(f"{name}: TIMEOUT", flush=True)


def read(outdir, name):
    with open(os.path.join(outdir, name + ".truth.json")) as f:
        return json.load(f)["info"]


def save_model():
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(235)
    m = LlamaForCausalLM(llama_cfg(**LLAMA))
    m.save_pretrained(SAVED)


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    if len(sys.argv) > 3 and sys.argv[2] == "--one":
        try:
            run_one(sys.argv[3], outdir, int(sys.argv[4]) if len(sys.argv) > 4 else None)
        except Exception:
            traceback.print_exc()
            sys.exit(3)
        return
    names = sys.argv[2:] or ["ladder"] + list(FUNCS)
    for name in names:
        if name != "ladder":
            spawn(outdir, name)
            continue
        t0 = time.time()
        save_model()
        print(f"saved the ladder's model in {time.time() - t0:.1f}s", flush=True)
        for n in FREE:
            spawn(outdir, n)
        f8, f16 = read(outdir, "llama_free_b8"), read(outdir, "llama_free_b16")
        p16 = f16["step_peaks_allocated_reserved"]
        # below batch 16's first step, so that it dies in its first forward or backward; above batch 8
        top = p16[0][1] if p16[0][1] > f8["max_reserved"] * 1.05 else f16["max_reserved"]
        budget1 = (f8["max_reserved"] + top) // 2
        budget2 = (p16[0][1] + p16[1][1]) // 2
        with open(os.path.join(outdir, "llama_ladder.json"), "w") as f:
            json.dump({"budget1_bytes": budget1, "budget2_bytes": budget2, "free_b8": f8["step_peaks_allocated_reserved"],
                       "free_b16": p16, "seq": SEQ, "model": LLAMA}, f, indent=1)
        print(f"budget1 {budget1 / GiB:.2f} GiB, budget2 {budget2 / GiB:.2f} GiB", flush=True)
        for n in LADDER1:
            spawn(outdir, n, budget1)
        if budget2 > p16[0][1] * 1.01:
            for n in LADDER2:
                spawn(outdir, n, budget2)
        else:
            print("no room between step 1 and step 2 of free_b16: LADDER2 skipped", flush=True)


if __name__ == "__main__":
    main()
