"""A Lightning callback that captures each rank's OOM for fragscope:

    trainer = L.Trainer(..., callbacks=[fragscope.lightning.MemoryCapture()])

It starts recording in `setup`, so the history covers the whole fit; at an OOM the observer
uploads the snapshot with the run key (the launcher's job id) and `trainer.global_rank`, and
`on_exception` catches an OutOfMemoryError the observer missed. With `on_exit=True` it also
uploads one snapshot at the end of `fit`. Lightning is imported here, not by `import fragscope`;
`lightning.Callback` is the base, else `pytorch_lightning.Callback`."""

from .callbacks import Recorder


def _base():
    try:
        from lightning.pytorch import Callback

        return Callback
    except ImportError:
        pass
    try:
        from pytorch_lightning import Callback

        return Callback
    except ImportError:
        return object  # the hooks still work when called, as the tests call them


class MemoryCapture(_base()):
    """`url`, `token`: the fragscope server (default $FRAGSCOPE_URL, $FRAGSCOPE_TOKEN; without a
    URL snapshots are saved to local files); `max_entries`: the history's ring buffer; `on_exit`:
    also upload a snapshot when `fit` ends; `run`: the run key (default the launcher's job id)."""

    def __init__(self, url=None, token=None, max_entries=100_000, on_exit=False, run=None, fallback_dir=None):
        super().__init__()
        self.recorder = Recorder(url, token, max_entries, on_exit, run, fallback_dir)

    def setup(self, trainer, pl_module, stage):
        if stage in (None, "fit") or getattr(stage, "value", stage) == "fit":
            self.recorder.start(getattr(trainer, "global_rank", None))

    def on_exception(self, trainer, pl_module, exception):
        self.recorder.exception(exception)

    def on_fit_end(self, trainer, pl_module):
        self.recorder.end()

    def teardown(self, trainer, pl_module, stage):
        self.recorder.end()
