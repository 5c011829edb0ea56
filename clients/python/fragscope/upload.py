"""Sending a snapshot to the server, and keeping it on disk when the server cannot be reached:
a snapshot taken at an OOM is never lost."""

import json
import os
import pickle
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

# Launchers' job ids, most specific first: what a job's ranks have in common.
RUN_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "JOB_ID", "FLUX_JOB_ID")
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def default_run():
    """The job's id where the launcher sets one (torchrun, Slurm, LSF, PBS, SGE, Flux)."""
    for name in RUN_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value and value != "none":
            return value
    return None


def default_rank():
    """This process's rank where the launcher sets one."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


class Delivery:
    """Where a snapshot went: the server's answer (`id`, `page_url`, `run_url`, `delete_key`), or the local
    file it was saved to when the server could not take it (`saved`, with `error`)."""

    def __init__(self, answer=None, base=None, saved=None, error=None):
        self.answer = answer or {}
        self.id = self.answer.get("id")
        self.page_url = base + self.answer["page_url"] if answer else None
        run = self.answer.get("run")
        self.run_url = base + run["page_url"] if run else None
        # Deletes this upload (and its run, when it started it); the server keeps only a hash.
        self.delete_key = self.answer.get("delete_key")
        self.saved = saved
        self.error = error

    @property
    def ok(self):
        return self.id is not None

    def __repr__(self):
        return f"Delivery(page_url={self.page_url!r})" if self.ok else f"Delivery(saved={self.saved!r}, error={self.error!r})"


def _bytes_of(path_or_snapshot):
    if isinstance(path_or_snapshot, (bytes, bytearray)):
        return bytes(path_or_snapshot), "snapshot"
    if isinstance(path_or_snapshot, dict):
        return pickle.dumps(path_or_snapshot, protocol=4), "snapshot"
    path = os.fspath(path_or_snapshot)
    with open(path, "rb") as f:
        return f.read(), os.path.basename(path)


def _save(body, name, fallback_dir):
    directory = fallback_dir or os.environ.get("FRAGSCOPE_FALLBACK_DIR") or os.getcwd()
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        directory = tempfile.gettempdir()
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80] or "snapshot"
    if not safe.endswith((".pickle", ".pkl", ".gz", ".zst", ".json")):
        safe += ".pickle"
    fd, path = tempfile.mkstemp(prefix=f"fragscope-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=f"-{safe}", dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    return path


def upload(path_or_snapshot, url, token=None, run=None, rank=None, name=None, note=None, timeout=10.0,
           fallback_dir=None, quiet=False):
    """Uploads a snapshot (a file path, pickled bytes, or the dict `torch.cuda.memory._snapshot()`
    returns) with a run key and rank. Prints the link on stderr and returns a `Delivery`. If the
    server cannot be reached within `timeout` seconds or refuses the upload, the snapshot is
    written to `fallback_dir` (else $FRAGSCOPE_FALLBACK_DIR, else the working directory) and that
    path is printed instead. It does not raise for either."""
    body, default_name = _bytes_of(path_or_snapshot)
    base = (url or "").rstrip("/")
    params = {"name": name or default_name}
    if note:
        params["note"] = note
    if run is not None:
        params["run"] = str(run)
    if rank is not None:
        params["rank"] = str(int(rank))
    try:
        if not base:
            raise ValueError("no server URL (pass url=, or set FRAGSCOPE_URL)")
        request = urllib.request.Request(f"{base}/api/v1/snapshots?{urllib.parse.urlencode(params)}", data=body,
                                         method="POST")
        request.add_header("Content-Type", "application/octet-stream")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=timeout) as r:
            delivery = Delivery(json.loads(r.read()), base)
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")[:500]
        delivery = Delivery(error=f"the server refused it ({e.code}): {detail}")
    except ValueError as e:  # no URL, or one urllib cannot use
        delivery = Delivery(error=str(e))
    except Exception as e:  # unreachable, timed out, reset: keep the snapshot
        delivery = Delivery(error=f"the server could not be reached: {e}")
    if not delivery.ok:
        delivery.saved = _save(body, params["name"], fallback_dir)
    if not quiet:
        if delivery.ok:
            where = f" (run: {delivery.run_url})" if delivery.run_url else ""
            print(f"fragscope: {delivery.page_url}{where}", file=sys.stderr)
        else:
            print(f"fragscope: {delivery.error}; snapshot saved to {delivery.saved}", file=sys.stderr)
    return delivery
