"""fragscope's Python client: capture a CUDA memory snapshot at an OOM and upload it, upload
files, and read analyses back as plain data or pandas DataFrames. Standard library only."""

from .capture import capture, stop
from .client import Client, Run, ServerError, Snapshot
from .upload import Delivery, upload, default_run, default_rank

__all__ = ["capture", "stop", "upload", "Delivery", "Client", "Snapshot", "Run", "ServerError", "default_run", "default_rank"]
__version__ = "0.1.0"


def __getattr__(name):
    # `fragscope.lightning` and `fragscope.transformers` import their framework only when used.
    if name in ("lightning", "transformers"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'fragscope' has no attribute {name!r}")
