"""The capture client for real, on one GPU: a job of three processes (ranks), each with its own
memory budget (torch.cuda.set_per_process_memory_fraction), each calling fragscope.capture()
against a fragscope server started here. Rank 1's budget is too small for its batch: it runs
out of memory, its OOM observer takes the snapshot and uploads it; the healthy ranks upload a
snapshot at their end with fragscope.upload(). Then the run must hold every rank, with rank 1,
and only rank 1, marked as the OOM rank.

    python3 tests/gpu/capture_ranks.py FRAGSCOPE_BINARY OUTDIR

Needs torch with CUDA. Writes OUTDIR/gpu_capture.json (the run as the API gives it) and
exits non-zero on a failed check. The README records what it showed."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))

GiB = 1 << 30
# The job id a launcher would set, shared by the ranks (the parent's, passed down).
RUN = os.environ.setdefault("FRAGSCOPE_GPU_TEST_RUN", f"gpu-test-{os.getpid()}")
# Budgets in GiB and the batch each rank trains with: rank 1's batch does not fit.
BUDGET = {0: 10, 1: 3, 2: 10}
BATCH = {0: 64, 1: 256, 2: 64}


def rank_main(rank, url):
    import torch
    import torch.nn as nn

    import fragscope

    os.environ["RANK"] = str(rank)
    os.environ["TORCHELASTIC_RUN_ID"] = RUN
    torch.cuda.set_per_process_memory_fraction(BUDGET[rank] * GiB / torch.cuda.get_device_properties(0).total_memory)
    run, got_rank = fragscope.capture(url)
    assert (run, got_rank) == (RUN, rank), (run, got_rank)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)) for _ in range(4)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    try:
        for step in range(6):
            x = torch.randn(BATCH[rank], 128, 2048, device="cuda")
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        d = fragscope.upload(torch.cuda.memory._snapshot(), url, run=RUN, rank=rank, name=f"rank{rank}-end.pickle")
        print(json.dumps({"rank": rank, "oom": False, "uploaded": d.ok}), flush=True)
    except torch.OutOfMemoryError:
        print(json.dumps({"rank": rank, "oom": True}), flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def serve(binary, out):
    """A fragscope server on a free loopback port with a fresh data folder, once it answers."""
    os.makedirs(out, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = os.path.join("/tmp", f"fragscope-gpu-{os.getpid()}")
    server = subprocess.Popen([binary, "serve", "--addr", f"127.0.0.1:{port}", "--data-dir", data],
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(out, "server.log"), "w"))
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return server, url


def main(binary, out):
    server, url = serve(binary, out)
    try:
        started = time.time()
        ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), url], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for r in BUDGET]
        reports = []
        for r, p in zip(BUDGET, ranks):
            stdout, stderr = p.communicate(timeout=400)
            print(f"rank {r} exit {p.returncode}\n{stdout}{stderr[-2000:]}", flush=True)
            reports.append({"rank": r, "exit": p.returncode, "stdout": stdout, "stderr": stderr[-2000:]})
        runs = get(url + "/api/v1/runs")
        run = next(x for x in runs if x["name"] == RUN)
        while run["summary"]["ready"] < run["summary"]["ranks"] and time.time() - started < 500:
            time.sleep(0.5)
            run = get(url + f"/api/v1/runs/{run['id']}")
        result = {"run": run, "reports": reports, "seconds": round(time.time() - started, 1)}
        with open(os.path.join(out, "gpu_capture.json"), "w") as f:
            json.dump(result, f, indent=1)
        checks = {
            "every rank is in the run": sorted(r["rank"] for r in run["ranks"]) == [0, 1, 2],
            "rank 1, only rank 1, is the OOM rank": run["summary"]["oom_ranks"] == [1],
            "the OOM rank's link was printed on stderr": "fragscope: http" in reports[1]["stderr"],
            "every analysis finished": run["summary"]["ready"] == 3,
        }
        for name, ok in checks.items():
            print(("PASS " if ok else "FAIL ") + name, flush=True)
        print(json.dumps(run["summary"]), flush=True)
        for r in run["ranks"]:
            print(f"rank {r['rank']}: {r['status']} oom={r['oom']} verdict={r['verdict']} "
                  f"peak_reserved={r['peak_reserved_bytes']} largest={r['largest_category']}", flush=True)
        return 0 if all(checks.values()) else 1
    finally:
        server.terminate()
        server.wait(timeout=20)


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(main(sys.argv[1], sys.argv[2]))
