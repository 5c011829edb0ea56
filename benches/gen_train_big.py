"""A big real training trace for the bench (#33: a snapshot not in ../shared), made on a GPU
machine with torch: a small GPT trained with varying sequence lengths, recorded with python
stacks into a ring of 3M entries for a time budget, then the snapshot and torch's counters.

Usage: python3 gen_train_big.py OUTDIR SECONDS   (writes train_big.pickle, train_big.truth.json)
Then: FRAGSCOPE_BIG_TRACE=OUTDIR/train_big.pickle cargo bench --bench bench
"""
import json, os, sys, time, random
import torch, torch.nn as nn, torch.nn.functional as F

out, budget_s = sys.argv[1], float(sys.argv[2])
torch.cuda.init()
torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
random.seed(0); torch.manual_seed(0)
vocab, d, layers, heads = 32000, 768, 6, 12

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(d); self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d); self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x, mask):
        h = self.ln1(x); a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(vocab, d); self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.ln = nn.LayerNorm(d); self.head = nn.Linear(d, vocab, bias=False)
    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), 1)
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))

model = GPT().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
t0, steps = time.time(), 0
while time.time() - t0 < budget_s:
    seq = random.choice([128, 192, 256, 384, 512])
    batch = max(1, 4096 // seq)
    idx = torch.randint(0, vocab, (batch, seq), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(idx).float().view(-1, vocab), idx.view(-1))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    steps += 1
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
path = os.path.join(out, "train_big.pickle")
t1 = time.time()
torch.cuda.memory._dump_snapshot(path)
dump_s = time.time() - t1
truth = {"scenario": "train_big", "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
         "steps": steps, "run_seconds": round(time.time() - t0, 1), "dump_seconds": round(dump_s, 1),
         "pickle_bytes": os.path.getsize(path), "memory_stats": dict(stats)}
json.dump(truth, open(os.path.join(out, "train_big.truth.json"), "w"), indent=1, sort_keys=True)
print(f"train_big: {steps} steps, pickle {truth['pickle_bytes']/2**20:.0f} MiB, dump {dump_s:.0f}s", flush=True)
