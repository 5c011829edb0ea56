"""The client against a real fragscope server (started by the cargo test suite, which sets
FRAGSCOPE_TEST_URL and FRAGSCOPE_FIXTURES). Expected values come from the fixtures' truth files."""

import contextlib
import io
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import tempfile
import types
import unittest

import fragscope
from fragscope.__main__ import ranks_of

URL = os.environ.get("FRAGSCOPE_TEST_URL")
FIXTURES = os.environ.get("FRAGSCOPE_FIXTURES", "")


def fixture(name):
    for candidate in (f"{name}.pickle", f"categories/{name}.pickle.zst", f"{name}.pickle.zst"):
        path = os.path.join(FIXTURES, candidate)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(name)


def truth(name):
    for candidate in (f"{name}.truth.json", f"categories/{name}.truth.json"):
        path = os.path.join(FIXTURES, candidate)
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
    raise FileNotFoundError(name)


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@unittest.skipUnless(URL, "FRAGSCOPE_TEST_URL is not set: run through cargo test")
class AgainstTheServer(unittest.TestCase):
    def test_upload_then_read_the_diagnosis(self):
        d = fragscope.upload(fixture("seed_frag_default"), URL, name="from python", quiet=True)
        self.assertTrue(d.ok, d)
        self.assertRegex(d.id, r"^[0-9a-f]{32}$")
        self.assertEqual(d.page_url, f"{URL}/s/{d.id}")
        snap = fragscope.Client(URL).snapshot(d.id)
        self.assertEqual(snap.wait()["name"], "from python")
        self.assertEqual(snap.diagnosis()["verdict"], "fragmentation")
        t = snap.timeline(points=50)
        events = snap.analysis()["devices"][0]["trace"]["events"]
        self.assertEqual(t["events"], events)
        b = snap.breakdown()
        self.assertEqual(sum(b["categories"].values()), b["allocated_bytes"])

    def test_only_the_delete_key_deletes_an_upload_on_an_open_server(self):
        client = fragscope.Client(URL)
        snap = client.upload(fixture("seed_frag_default"), name="to delete")
        self.assertRegex(snap.delete_key, r"^[0-9a-f]{32}$")
        with self.assertRaises(fragscope.ServerError) as e:
            client.snapshot(snap.id).delete()
        self.assertEqual(e.exception.status, 403)
        with self.assertRaises(fragscope.ServerError) as e:
            client.snapshot(snap.id, delete_key="0" * 32).delete()
        self.assertEqual(e.exception.status, 403)
        snap.delete()
        with self.assertRaises(fragscope.ServerError) as e:
            snap.status()
        self.assertEqual(e.exception.status, 404)

    def test_dataframes(self):
        try:
            import pandas  # noqa: F401
        except ImportError:
            self.skipTest("pandas is not installed")
        snap = fragscope.Client(URL).upload(fixture("capacity_oom"))
        frame = snap.timeline(points=100, frame=True)
        self.assertIn("reserved_bytes_max", frame.columns)
        peak = truth("capacity_oom")["memory_stats"]["reserved_bytes.all.peak"]
        self.assertEqual(int(frame["reserved_bytes_max"].max()), peak)
        sites = snap.breakdown(frame=True)
        self.assertEqual(list(sites.columns), ["call_site", "category", "bytes", "blocks"])

    def test_the_shell_command_makes_one_run_with_the_oom_rank(self):
        files = [fixture(f"ranks3_rank{r}") for r in (2, 0, 1)]
        self.assertEqual(ranks_of(files), [2, 0, 1])
        out = subprocess.run([sys.executable, "-m", "fragscope", "upload", *files, "--url", URL, "--run", "py-job"],
                             capture_output=True, text=True, timeout=120, env=dict(os.environ))
        self.assertEqual(out.returncode, 0, out.stderr)
        run_url = re.search(r"^run: (\S+)$", out.stdout, re.M).group(1)
        run = fragscope.Client(URL).run(run_url.rsplit("/", 1)[1])
        for s in run.snapshots():
            s.wait()
        view = run.view()
        want = [r for r in (0, 1, 2) if truth(f"ranks3_rank{r}")["memory_stats"]["num_ooms"] > 0]
        self.assertEqual(view["summary"]["oom_ranks"], want)
        self.assertEqual([r["rank"] for r in view["ranks"]], [0, 1, 2])
        self.assertEqual(view["name"], "py-job")
        # Rank 1's generator fed it batches twice the others' (tests/fixtures/README.md).
        why = run.divergence()
        self.assertEqual(why["rank"], 1)
        self.assertAlmostEqual(why["size_ratio"], 2.0, delta=0.2)
        self.assertIn("more activation", why["sentence"])

    def test_an_unreachable_server_gets_a_local_file_and_its_path(self):
        with open(fixture("seed_frag_default"), "rb") as f:
            data = f.read()
        with tempfile.TemporaryDirectory() as tmp:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                d = fragscope.upload(data, f"http://127.0.0.1:{closed_port()}", fallback_dir=tmp, timeout=3)
            self.assertFalse(d.ok)
            self.assertTrue(d.saved.startswith(tmp))
            with open(d.saved, "rb") as f:
                self.assertEqual(f.read(), data, "the snapshot is kept whole")
            self.assertIn(d.saved, err.getvalue())

    def test_a_refused_upload_is_kept_too(self):
        with tempfile.TemporaryDirectory() as tmp:
            d = fragscope.upload(b"not a snapshot at all", URL, fallback_dir=tmp, quiet=True)
            self.assertFalse(d.ok)
            self.assertIn("refused", d.error)
            self.assertTrue(os.path.exists(d.saved))

    def test_the_oom_observer_uploads_with_the_run_and_rank_and_never_raises(self):
        # torch's hooks, recorded: the real ones are exercised on a GPU by tests/gpu.
        with open(fixture("capacity_oom"), "rb") as f:
            snapshot = pickle.load(f)
        hooks = {}
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
            _record_memory_history=lambda **kw: hooks.setdefault("record", kw),
            _snapshot=lambda: snapshot),
            get_device_properties=lambda d: types.SimpleNamespace(total_memory=16 << 30),
            get_per_process_memory_fraction=lambda d: 0.5)
        torch._C = types.SimpleNamespace(_cuda_attach_out_of_memory_observer=lambda f: hooks.setdefault("observer", f))
        saved = sys.modules.get("torch")
        sys.modules["torch"] = torch
        os.environ["TORCHELASTIC_RUN_ID"] = "elastic-42"
        os.environ["RANK"] = "3"
        try:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(fragscope.capture(URL, max_entries=1234), ("elastic-42", 3))
                self.assertEqual(hooks["record"]["max_entries"], 1234)
                hooks["observer"](0, 1 << 30, 2 << 30, 0)
                torch.cuda.memory._snapshot = lambda: 1 / 0
                hooks["observer"](0, 1, 1, 0)  # must not raise
        finally:
            del os.environ["TORCHELASTIC_RUN_ID"], os.environ["RANK"]
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved
        text = err.getvalue()
        self.assertIn("could not capture", text)
        run_url = re.search(r"\(run: (\S+)\)", text).group(1)
        view = fragscope.Client(URL).run(run_url.rsplit("/", 1)[1]).view()
        self.assertEqual(view["name"], "elastic-42")
        self.assertEqual([r["rank"] for r in view["ranks"]], [3])
        # The device's total and the per-process budget went with the snapshot, and the
        # diagnosis weighs the step against that budget.
        snap = fragscope.Client(URL).run(run_url.rsplit("/", 1)[1]).snapshots()[0]
        snap.wait()
        diagnosis = snap.diagnosis()
        self.assertEqual(diagnosis["need"]["budget_bytes"], 8 << 30)
        self.assertIn("recorded at capture", diagnosis["need"]["budget_basis"])
        self.assertEqual(diagnosis["outside"]["device_total_bytes"], 16 << 30)


class FakeOOM(RuntimeError):
    """Named as torch's is: the callbacks tell an OOM by its class name."""


FakeOOM.__name__ = "OutOfMemoryError"


@contextlib.contextmanager
def stand_in_torch(snapshot, hooks):
    """torch's hooks, recorded: the real ones run on a GPU in tests/gpu/callbacks.py."""
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        memory=types.SimpleNamespace(
            _record_memory_history=lambda *a, **kw: hooks.setdefault("record", []).append((a, kw)),
            _snapshot=lambda: dict(snapshot)),
        get_device_properties=lambda d: types.SimpleNamespace(total_memory=16 << 30),
        get_per_process_memory_fraction=lambda d: 0.5,
        current_device=lambda: 0)
    torch._C = types.SimpleNamespace(_cuda_attach_out_of_memory_observer=lambda f: hooks.__setitem__("observer", f))
    saved = sys.modules.get("torch")
    sys.modules["torch"] = torch
    try:
        yield torch
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved


@unittest.skipUnless(URL, "FRAGSCOPE_TEST_URL is not set: run through cargo test")
class Callbacks(unittest.TestCase):
    """The Lightning and transformers callbacks driven by stand-in trainers (no framework
    installed here), against the real server."""

    def setUp(self):
        with open(fixture("capacity_oom"), "rb") as f:
            self.snapshot = pickle.load(f)
        os.environ["FRAGSCOPE_URL"] = URL

    def tearDown(self):
        os.environ.pop("FRAGSCOPE_URL", None)

    def run_view(self, text):
        run_url = re.search(r"\(run: (\S+)\)", text).group(1)
        return fragscope.Client(URL).run(run_url.rsplit("/", 1)[1]).view()

    def test_lightning_uploads_the_oom_of_its_global_rank_and_never_raises(self):
        from fragscope.lightning import MemoryCapture

        hooks, err = {}, io.StringIO()
        trainer = types.SimpleNamespace(global_rank=2)
        with stand_in_torch(self.snapshot, hooks) as torch, contextlib.redirect_stderr(err):
            cb = MemoryCapture(run="lightning-job", max_entries=777)
            cb.setup(trainer, None, "fit")
            self.assertEqual(hooks["record"][0][1]["max_entries"], 777)
            hooks["observer"](0, 1 << 30, 2 << 30, 0)  # the allocation that failed
            cb.on_exception(trainer, None, FakeOOM("CUDA out of memory"))  # already captured: nothing more
            torch.cuda.memory._snapshot = lambda: 1 / 0
            cb.on_exception(trainer, None, FakeOOM("again"))  # must not raise
            cb.teardown(trainer, None, "fit")
        text = err.getvalue()
        self.assertEqual(text.count("fragscope: http"), 1, text)
        view = self.run_view(text)
        self.assertEqual(view["name"], "lightning-job")
        self.assertEqual([r["rank"] for r in view["ranks"]], [2])
        self.assertEqual(hooks["record"][-1][1].get("enabled", "stopped"), None, "recording stops at teardown")

    def test_an_oom_the_observer_missed_is_captured_by_on_exception(self):
        from fragscope.lightning import MemoryCapture

        hooks, err = {}, io.StringIO()
        trainer = types.SimpleNamespace(global_rank=0)
        with stand_in_torch(self.snapshot, hooks), contextlib.redirect_stderr(err):
            cb = MemoryCapture(run="lightning-missed")
            cb.setup(trainer, None, "fit")
            cb.on_exception(trainer, None, ValueError("not an OOM"))
            self.assertNotIn("fragscope: http", err.getvalue())
            cb.on_exception(trainer, None, FakeOOM("CUDA out of memory. Tried to allocate 2.00 GiB"))
        view = self.run_view(err.getvalue())
        self.assertEqual([r["rank"] for r in view["ranks"]], [0])

    def test_transformers_uploads_at_the_end_with_on_exit_under_its_process_index(self):
        from fragscope.transformers import MemoryCapture

        hooks, err = {}, io.StringIO()
        args = types.SimpleNamespace(process_index=1)
        with stand_in_torch(self.snapshot, hooks), contextlib.redirect_stderr(err):
            cb = MemoryCapture(run="trainer-job", on_exit=True)
            cb.on_train_begin(args, None, None)
            cb.on_train_end(args, None, None)
        view = self.run_view(err.getvalue())
        self.assertEqual(view["name"], "trainer-job")
        self.assertEqual([r["rank"] for r in view["ranks"]], [1])

    def test_with_the_server_down_the_snapshot_is_kept_in_a_file(self):
        from fragscope.transformers import MemoryCapture

        hooks, err = {}, io.StringIO()
        with tempfile.TemporaryDirectory() as keep, stand_in_torch(self.snapshot, hooks), \
                contextlib.redirect_stderr(err):
            cb = MemoryCapture(url=f"http://127.0.0.1:{closed_port()}", run="down", fallback_dir=keep)
            cb.on_train_begin(types.SimpleNamespace(process_index=0), None, None)
            hooks["observer"](0, 1 << 30, 2 << 30, 0)
            saved = os.listdir(keep)
            self.assertEqual(len(saved), 1, err.getvalue())
            with open(os.path.join(keep, saved[0]), "rb") as f:
                self.assertEqual(pickle.load(f)["segments"], self.snapshot["segments"])
        self.assertIn("snapshot saved to", err.getvalue())


class Frames(unittest.TestCase):
    def test_a_frame_without_pandas_says_what_to_install(self):
        from fragscope.client import _frame

        saved = sys.modules.get("pandas")
        sys.modules["pandas"] = None  # as if not installed
        try:
            with self.assertRaises(ImportError) as e:
                _frame({"a": [1]})
        finally:
            if saved is None:
                del sys.modules["pandas"]
            else:
                sys.modules["pandas"] = saved
        self.assertIn("pip install pandas", str(e.exception))


class Defaults(unittest.TestCase):
    def test_run_and_rank_come_from_the_launcher(self):
        keep = {k: os.environ.pop(k) for k in list(os.environ) if k in fragscope.upload.__globals__["RUN_VARIABLES"]
                or k in fragscope.upload.__globals__["RANK_VARIABLES"]}
        try:
            self.assertIsNone(fragscope.default_run())
            os.environ["SLURM_JOB_ID"] = "991"
            os.environ["SLURM_PROCID"] = "7"
            self.assertEqual((fragscope.default_run(), fragscope.default_rank()), ("991", 7))
            os.environ["TORCHELASTIC_RUN_ID"] = "te"
            self.assertEqual(fragscope.default_run(), "te")
        finally:
            for k in ("SLURM_JOB_ID", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"):
                os.environ.pop(k, None)
            os.environ.update(keep)


if __name__ == "__main__":
    unittest.main()
