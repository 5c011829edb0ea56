"""The framework callbacks for real, on one GPU: a Lightning job and a transformers Trainer job,
each a GPT-2 whose batch outgrows a per-process budget (torch.cuda.set_per_process_memory_fraction),
each with fragscope's MemoryCapture in its callbacks and FRAGSCOPE_URL pointing at a fragscope
server started here. Each job must leave a run of one rank that holds its OOM, diagnosed.

    python3 tests/gpu/callbacks.py FRAGSCOPE_BINARY OUTDIR

Needs torch with CUDA, lightning and transformers. Writes OUTDIR/gpu_callbacks.json (the runs as
the API gives them) and exits non-zero on a failed check. The README records what it showed."""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, HERE)

from capture_ranks import get, serve  # noqa: E402

GiB = 1 << 30
BUDGET = 4 * GiB


def gpt2(torch):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(150)
    cfg = GPT2Config(n_embd=1024, n_layer=8, n_head=16, vocab_size=50257, n_positions=1024)
    return GPT2LMHeadModel(cfg), cfg.vocab_size


def budget(torch):
    torch.cuda.set_per_process_memory_fraction(BUDGET / torch.cuda.get_device_properties(0).total_memory)


def lightning_job():
    import lightning as L
    import torch

    import fragscope.lightning

    budget(torch)
    model, vocab = gpt2(torch)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, i):
            return self.net(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    data = torch.utils.data.DataLoader([torch.randint(0, vocab, (1024,)) for _ in range(64)], batch_size=32)
    trainer = L.Trainer(accelerator="cuda", devices=1, max_steps=3, precision="bf16-mixed", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[fragscope.lightning.MemoryCapture()])
    try:
        trainer.fit(Module(), data)
        print(json.dumps({"job": "lightning", "oom": False}), flush=True)
    except torch.OutOfMemoryError:
        print(json.dumps({"job": "lightning", "oom": True}), flush=True)


def trainer_job():
    import torch
    from transformers import Trainer, TrainingArguments

    import fragscope.transformers

    budget(torch)
    model, vocab = gpt2(torch)
    data = [{"input_ids": ids, "labels": ids} for ids in (torch.randint(0, vocab, (1024,)) for _ in range(64))]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=32, max_steps=3, bf16=True,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    try:
        Trainer(model=model, args=args, train_dataset=data, callbacks=[fragscope.transformers.MemoryCapture()]).train()
        print(json.dumps({"job": "trainer", "oom": False}), flush=True)
    except torch.OutOfMemoryError:
        print(json.dumps({"job": "trainer", "oom": True}), flush=True)


def main(binary, out):
    server, url = serve(binary, out)
    try:
        results, checks = {}, {}
        for job in ("lightning", "trainer"):
            run_key = f"gpu-{job}-{os.getpid()}"
            env = dict(os.environ, FRAGSCOPE_URL=url, TORCHELASTIC_RUN_ID=run_key)
            p = subprocess.run([sys.executable, __file__, "--job", job], env=env, capture_output=True, text=True,
                               timeout=400)
            print(f"{job}: exit {p.returncode}\n{p.stdout}{p.stderr[-3000:]}", flush=True)
            started = time.time()
            run = next((x for x in get(url + "/api/v1/runs") if x["name"] == run_key), None)
            while run and run["summary"]["ready"] < run["summary"]["ranks"] and time.time() - started < 120:
                time.sleep(0.5)
                run = get(url + f"/api/v1/runs/{run['id']}")
            results[job] = {"run": run, "exit": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-3000:]}
            ranks = run["ranks"] if run else []
            checks[f"{job}: the job ran out of memory"] = '"oom": true' in p.stdout
            checks[f"{job}: the link was printed on stderr"] = "fragscope: http" in p.stderr
            checks[f"{job}: the run holds rank 0, its OOM rank"] = bool(run) and run["summary"]["oom_ranks"] == [0]
            checks[f"{job}: its verdict is capacity"] = [r.get("verdict") for r in ranks] == ["capacity"]
            for r in ranks:
                print(f"{job} rank {r['rank']}: {r['status']} oom={r['oom']} verdict={r['verdict']} "
                      f"peak_reserved={r['peak_reserved_bytes']} largest={r['largest_category']}", flush=True)
        with open(os.path.join(out, "gpu_callbacks.json"), "w") as f:
            json.dump(results, f, indent=1)
        for name, ok in checks.items():
            print(("PASS " if ok else "FAIL ") + name, flush=True)
        return 0 if all(checks.values()) else 1
    finally:
        server.terminate()
        server.wait(timeout=20)


if __name__ == "__main__":
    if sys.argv[1] == "--job":
        {"lightning": lightning_job, "trainer": trainer_job}[sys.argv[2]]()
    else:
        sys.exit(main(sys.argv[1], sys.argv[2]))
