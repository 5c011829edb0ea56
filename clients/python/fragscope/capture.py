"""Capture at the OOM: record the allocator's history from the start, and when an allocation
fails, take the snapshot right there (before the exception unwinds and frees the evidence)
and send it to the server with the job's run key and rank."""

import sys
import threading

from .upload import default_rank, default_run, upload

_state = {"observer": None, "sent": 0}
_lock = threading.Lock()


def capture(url, token=None, run=None, rank=None, max_entries=100_000, max_uploads=3, timeout=10.0,
            fallback_dir=None, stacks="python"):
    """Starts `torch.cuda.memory._record_memory_history` and registers an out-of-memory observer
    that uploads `torch.cuda.memory._snapshot()` at each OOM (at most `max_uploads` per process).

    `run` defaults to the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ...), `rank` to
    RANK (or SLURM_PROCID, ...). The observer never raises: whatever fails is printed on stderr,
    and a snapshot the server cannot take is written to a local file whose path is printed.
    Returns the run key and rank it will use."""
    import torch

    run = run if run is not None else default_run()
    rank = rank if rank is not None else default_rank()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks=stacks)

    def observer(device, alloc, device_alloc, device_free):
        try:
            with _lock:
                if _state["sent"] >= max_uploads:
                    return
                _state["sent"] += 1
            snapshot = torch.cuda.memory._snapshot()
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

    torch._C._cuda_attach_out_of_memory_observer(observer)
    _state["observer"] = observer
    return run, rank


def stop():
    """Stops recording the allocator's history (the observer stays attached but is inert)."""
    import torch

    with _lock:
        _state["sent"] = 1 << 30
    torch.cuda.memory._record_memory_history(enabled=None)
