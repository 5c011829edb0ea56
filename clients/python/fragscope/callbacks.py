"""What the framework callbacks share: start recording when training starts, make sure an OOM
is captured (the observer does it at the failed allocation; an exception hook catches one the
observer missed), and optionally upload one snapshot when training ends. A callback never
raises into the training loop: whatever fails is printed on stderr, and a snapshot the server
cannot take is written to a local file (see `upload`)."""

import os
import sys

from .capture import capture, device_context, sent, stop
from .upload import default_run, upload


def _say(message):
    try:
        print(f"fragscope: {message}", file=sys.stderr)
    except Exception:
        pass


def is_oom(exception):
    """torch.OutOfMemoryError (torch.cuda.OutOfMemoryError before torch 2.3), by name so that
    no torch import is needed to ask."""
    names = {c.__name__ for c in type(exception).__mro__}
    return "OutOfMemoryError" in names


class Recorder:
    """One training job's capture, driven by a framework's hooks."""

    def __init__(self, url=None, token=None, max_entries=100_000, on_exit=False, run=None, fallback_dir=None):
        self.url = url or os.environ.get("FRAGSCOPE_URL")
        self.token = token or os.environ.get("FRAGSCOPE_TOKEN")
        self.max_entries = max_entries
        self.on_exit = on_exit
        self.run = run
        self.fallback_dir = fallback_dir
        self.rank = None
        self.started = False

    def start(self, rank):
        """Starts recording with the OOM observer attached (once per process)."""
        if self.started:
            return
        try:
            self.rank = rank
            self.run, _ = capture(self.url, token=self.token, run=self.run, rank=rank, max_entries=self.max_entries,
                                  fallback_dir=self.fallback_dir)
            self.started = True
        except Exception as e:
            _say(f"could not start recording the allocator's history: {e!r}")

    def exception(self, exception):
        """At an exception out of training: an OOM the observer did not capture is captured now
        (the memory the step held may be partly freed already, but the history is there)."""
        try:
            if not self.started or not is_oom(exception) or sent() > 0:
                return
            self._send("oom", f"captured after an OutOfMemoryError: {str(exception).splitlines()[0][:300]}")
        except Exception as e:
            _say(f"could not capture the OOM snapshot: {e!r}")

    def end(self):
        """At the end of training: one snapshot with `on_exit`, then recording stops."""
        if not self.started:
            return
        try:
            if self.on_exit and sent() == 0:  # after an OOM, its snapshot is the one that matters
                self._send("end", "captured at the end of training")
        except Exception as e:
            _say(f"could not capture the snapshot at the end: {e!r}")
        finally:
            try:
                stop()
            except Exception:
                pass
            self.started = False

    def _send(self, what, note):
        import torch

        snapshot = torch.cuda.memory._snapshot()
        device = torch.cuda.current_device() if hasattr(torch.cuda, "current_device") else 0
        snapshot["fragscope_context"] = {"devices": [device_context(torch, device)]}
        who = f"rank{self.rank}" if self.rank is not None else "process"
        name = f"{self.run or default_run() or 'job'}-{who}-{what}.pickle"
        return upload(snapshot, self.url, token=self.token, run=self.run, rank=self.rank, name=name, note=note,
                      fallback_dir=self.fallback_dir)
