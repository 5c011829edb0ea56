"""Reading from a fragscope server: snapshots, their analysis and series, runs and
comparisons, as plain data (dicts and lists) or, with pandas installed, DataFrames."""

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request

from .upload import upload


class ServerError(Exception):
    """The server answered with an error: `status` and its `detail`."""

    def __init__(self, status, detail):
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class Client:
    """A fragscope server: `Client("http://host:8080", token=None)`."""

    def __init__(self, url, token=None, timeout=60.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _get(self, path, params=None, raw=False, method="GET", headers=None):
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        request = urllib.request.Request(self.url + path + query, method=method, headers=headers or {})
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            try:
                text = json.loads(text).get("detail", text)
            except ValueError:
                pass
            raise ServerError(e.code, text) from None
        return body if raw else (json.loads(body) if body else None)

    def upload(self, path_or_snapshot, **kwargs):
        """Uploads a snapshot (see `fragscope.upload`); returns its `Snapshot`, or raises
        `ServerError` when it could not be delivered (the file it was saved to is in the message)."""
        d = upload(path_or_snapshot, self.url, token=self.token, quiet=True, **kwargs)
        if not d.ok:
            raise ServerError(0, f"{d.error}; saved to {d.saved}")
        return Snapshot(self, d.id, delete_key=d.delete_key)

    def snapshot(self, id, delete_key=None):
        return Snapshot(self, id, delete_key=delete_key)

    def snapshots(self, limit=50):
        return self._get("/api/v1/snapshots", {"limit": limit})

    def run(self, id, delete_key=None):
        return Run(self, id, delete_key=delete_key)

    def compare(self, a, b):
        """Two snapshots side by side (`a` before, `b` after): the API's compare document."""
        ids = [x.id if isinstance(x, Snapshot) else x for x in (a, b)]
        return self._get("/api/v1/compare", {"a": ids[0], "b": ids[1]})


def _frame(columns):
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("frame=True needs pandas (pip install pandas, or pip install './clients/python[pandas]'); "
                          "without it, leave frame out for the same data as plain lists and dicts") from None
    return pd.DataFrame(columns)


class Snapshot:
    """One uploaded snapshot, by id."""

    def __init__(self, client, id, delete_key=None):
        self.client = client
        self.id = id
        # The upload's delete key: without a server token, only it deletes the upload.
        self.delete_key = delete_key

    @property
    def page_url(self):
        return f"{self.client.url}/s/{self.id}"

    def delete(self):
        """Deletes the upload: with the client's token, or the delete key its upload returned."""
        headers = {"X-Fragscope-Key": self.delete_key} if self.delete_key else None
        self.client._get(f"/api/v1/snapshots/{self.id}", raw=True, method="DELETE", headers=headers)

    def retry(self):
        """Queues a failed analysis again; returns the status."""
        return self.client._get(f"/api/v1/snapshots/{self.id}/retry", method="POST")

    def status(self):
        return self.client._get(f"/api/v1/snapshots/{self.id}")

    def wait(self, timeout=600.0, poll=0.2):
        """Waits for the analysis; returns the status (raises `ServerError` if it failed)."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.status()
            if s["status"] == "ready":
                return s
            if s["status"] == "failed":
                raise ServerError(422, s.get("error") or "the analysis failed")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the analysis of {self.id} is still {s['status']}")
            time.sleep(poll)

    def analysis(self):
        """The whole analysis document."""
        self.wait()
        return self.client._get(f"/api/v1/snapshots/{self.id}/analysis")

    def _device(self, device):
        if device is not None:
            return device
        devices = self.analysis()["devices"]
        with_oom = [d for d in devices if d["ooms"]]
        return (with_oom or devices)[0]["device"]

    def diagnosis(self, device=None):
        """The verdict, summary and remedies of a device (default: the first with an OOM)."""
        device = self._device(device)
        return next(d for d in self.client._get(f"/api/v1/snapshots/{self.id}/diagnosis") if d["device"] == device)["diagnosis"]

    def need(self, device=None):
        """What the step that died needed, against the budget (`peak_allocated_bytes`,
        `peak_reserved_bytes`, `budget_bytes`, `fits`, `basis`): a snapshot taken at an OOM ends
        at the OOM, so this is projected from the steps the trace does show. For a run without
        an OOM, its own peak."""
        return self.diagnosis(device)["need"]

    def remedies(self, device=None):
        """The remedies, each with its `effect`: `fixes`, `helps` (the run gets further, or
        saves memory, but not enough), `does_not_help` or `does_not_apply`."""
        return self.diagnosis(device)["remedies"]

    def timeline(self, device=None, points=2000, frame=False):
        """Memory over the events in `points` buckets: per series the bucket's min and max. With
        `frame=True`, a DataFrame with one row per bucket (`event`, `time_us`, `<series>_min`,
        `<series>_max`)."""
        device = self._device(device)
        t = self.client._get(f"/api/v1/snapshots/{self.id}/devices/{device}/timeline", {"points": points})
        if not frame:
            return t
        columns = {"event": t["event"], "time_us": t["time_us"]}
        for name, s in t["series"].items():
            columns[f"{name}_min"] = s["min"]
            columns[f"{name}_max"] = s["max"]
        return _frame(columns)

    def breakdown(self, device=None, event=None, frame=False):
        """What fills memory right after `event` (default: the end): bytes by category and the
        top call sites. With `frame=True`, a DataFrame of the call sites."""
        device = self._device(device)
        params = {"event": event} if event is not None else None
        b = self.client._get(f"/api/v1/snapshots/{self.id}/devices/{device}/breakdown", params)
        if not frame:
            return b
        rows = [
            {
                "call_site": (f"{s['call_site']['filename']}:{s['call_site']['line']} ({s['call_site']['name']})"
                              if s.get("call_site") else "unknown"),
                "category": s["category"],
                "bytes": s["bytes"],
                "blocks": s["blocks"],
            }
            for s in b["call_sites"]
        ]
        return _frame({k: [r[k] for r in rows] for k in ("call_site", "category", "bytes", "blocks")})

    def pinners(self, device=None, event=None, frame=False):
        """Who pins free memory right after `event` (default: the end), most pinned bytes first.
        With `frame=True`, a DataFrame (`call_site`, `blocks`, `live_bytes`, `pinned_free_bytes`)."""
        device = self._device(device)
        params = {"event": event} if event is not None else None
        p = self.client._get(f"/api/v1/snapshots/{self.id}/devices/{device}/pinners", params)
        if not frame:
            return p
        site = lambda c: f"{c['filename']}:{c['line']} ({c['name']})" if c else None  # noqa: E731
        cols = ("call_site", "blocks", "live_bytes", "pinned_free_bytes")
        return _frame({k: [site(x["call_site"]) if k == "call_site" else x[k] for x in p["pinners"]] for k in cols})

    def download(self, path):
        """Writes the original upload to `path`."""
        data = self.client._get(f"/api/v1/snapshots/{self.id}/blob", raw=True)
        with open(os.fspath(path), "wb") as f:
            f.write(data)
        return path

    def __repr__(self):
        return f"Snapshot({self.page_url!r})"


class Run:
    """A run: one job's ranks."""

    def __init__(self, client, id, delete_key=None):
        self.client = client
        self.id = id
        # The delete key of the upload that started the run.
        self.delete_key = delete_key

    def delete(self):
        """Deletes the run and its uploads: with the client's token, or the starting upload's key."""
        headers = {"X-Fragscope-Key": self.delete_key} if self.delete_key else None
        self.client._get(f"/api/v1/runs/{self.id}", raw=True, method="DELETE", headers=headers)

    def view(self):
        return self.client._get(f"/api/v1/runs/{self.id}")

    def ranks(self, frame=False):
        """One entry per rank: peaks, OOM, verdict, pinned free bytes, largest category."""
        ranks = self.view()["ranks"]
        return _frame({k: [r[k] for r in ranks] for k in ranks[0]}) if frame and ranks else ranks

    def snapshots(self):
        return [Snapshot(self.client, r["snapshot_id"]) for r in self.view()["ranks"]]

    def divergence(self):
        """Why the OOM rank (else the highest) differs from the median rank: `sentence`, the
        categories and call sites it held more of, and `size_ratio` (about the batch ratio when
        the batch differs). None with fewer than two ranks analysed, or nothing to explain."""
        return self.view()["summary"].get("divergence")
