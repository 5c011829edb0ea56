"""Capture at the OOM: record the allocator's history from the start, and when an allocation
fails, take the snapshot right there (before the exception unwinds and frees the evidence)
and send it to the server with the job's run key and rank."""

import sys
import threading

from .upload import default_rank, default_run, upload

_state = {"observer": None, "sent": 0}
_lock = threading.Lock()


def capture(url=None, token=None, run=None, rank=None, max_entries=100_000, max_uploads=3, timeout=10.0,
            fallback_dir=None, stacks="python"):
    """Starts `torch.cuda.memory._record_memory_history` and registers an out-of-memory observer
    that uploads `torch.cuda.memory._snapshot()` at each OOM (at most `max_uploads` per process).

    `run` defaults to the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ...), `rank` to
    RANK (or SLURM_PROCID, ...). The observer never raises: whatever fails is printed on stderr,
    and a snapshot the server cannot take is written to a local file whose path is printed.
    `url` and `token` default to $FRAGSCOPE_URL and $FRAGSCOPE_TOKEN; without a URL every
    snapshot goes to the local file. Returns the run key and rank it will use."""
    import os

    import torch

    url = url or os.environ.get("FRAGSCOPE_URL")
    token = token or os.environ.get("FRAGSCOPE_TOKEN")
    run = run if run is not None else default_run()
    rank = rank if rank is not None else default_rank()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks=stacks)

    def observer(device, alloc, device_alloc, device_free):
        try:
            with _lock:
                # A later capture() replaced this one (torch keeps every observer attached).
                if _state["observer"] is not observer or _state["sent"] >= max_uploads:
                    return
                _state["sent"] += 1
            snapshot = torch.cuda.memory._snapshot()
            snapshot["fragscope_context"] = {"devices": [device_context(torch, device)]}
            who = f"rank{rank}" if rank is not None else "process"
            name = f"{run or 'job'}-{who}-oom-cuda{device}.pickle"
            note = f"captured at an OOM on cuda:{device}: {alloc} bytes asked, {device_free} free on the device"
            upload(snapshot, url, token=token, run=run, rank=rank, name=name, note=note, timeout=timeout,
                   fallback_dir=fallback_dir)
        except BaseException as e:  # an observer must never raise into the allocator
            try:
                print(f"fragscope: could not capture the OOM snapshot: {e!r}", file=sys.stderr)
            except BaseException:
                pass

    with _lock:
        _state["observer"] = observer
        _state["sent"] = 0
    torch._C._cuda_attach_out_of_memory_observer(observer)
    return run, rank


def sent():
    """Snapshots the observer has taken in this process."""
    return _state["sent"] if _state["observer"] is not None else 0


def device_context(torch, device):
    """What the snapshot does not record and the diagnosis needs: the device's total memory and
    the per-process budget (`set_per_process_memory_fraction`), read without a CUDA call that
    could allocate (the observer runs inside a failed allocation)."""
    context = {"device": int(device)}
    try:
        total = int(torch.cuda.get_device_properties(device).total_memory)
        context["total_bytes"] = total
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        fraction = float(get_fraction(device)) if get_fraction is not None else 1.0
        if 0.0 < fraction < 1.0:
            context["budget_bytes"] = int(total * fraction)
    except Exception:  # the context only sharpens the diagnosis; the snapshot goes without it
        pass
    return context


def stop():
    """Stops recording the allocator's history (the observer stays attached but is inert)."""
    import torch

    with _lock:
        _state["sent"] = 1 << 30
    torch.cuda.memory._record_memory_history(enabled=None)
