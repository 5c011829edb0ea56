"""A transformers TrainerCallback that captures each rank's OOM for fragscope:

    trainer = Trainer(..., callbacks=[fragscope.transformers.MemoryCapture()])

It starts recording at `on_train_begin`; at an OOM the observer uploads the snapshot with the
run key (the launcher's job id) and `args.process_index` as the rank. With `on_exit=True` it
also uploads one snapshot at `on_train_end`. transformers is imported here, not by
`import fragscope`."""

from .callbacks import Recorder


def _base():
    try:
        from transformers import TrainerCallback

        return TrainerCallback
    except ImportError:
        return object  # the hooks still work when called, as the tests call them


class MemoryCapture(_base()):
    """`url`, `token`: the fragscope server (default $FRAGSCOPE_URL, $FRAGSCOPE_TOKEN; without a
    URL snapshots are saved to local files); `max_entries`: the history's ring buffer; `on_exit`:
    also upload a snapshot when training ends; `run`: the run key (default the launcher's job id)."""

    def __init__(self, url=None, token=None, max_entries=100_000, on_exit=False, run=None, fallback_dir=None):
        super().__init__()
        self.recorder = Recorder(url, token, max_entries, on_exit, run, fallback_dir)

    def on_train_begin(self, args, state, control, **kwargs):
        self.recorder.start(getattr(args, "process_index", None))

    def on_train_end(self, args, state, control, **kwargs):
        self.recorder.end()
