# fragscope from a notebook: upload a snapshot, wait for the analysis, and load the timeline
# and the pinners into pandas. The same cells are in notebook.ipynb.
#
#   python3 examples/notebook.py --url http://127.0.0.1:8080 --file snapshot.pickle [--token T]
#
# Needs: pip install requests pandas

# %%
import argparse
import sys
import time

import pandas as pd
import requests

args = argparse.ArgumentParser()
args.add_argument("--url", default="http://127.0.0.1:8080")
args.add_argument("--file", required=True)
args.add_argument("--token", default=None)
opts = args.parse_args(sys.argv[1:] if "ipykernel" not in sys.modules else ["--file", "snapshot.pickle"])
BASE = opts.url.rstrip("/")
AUTH = {"Authorization": f"Bearer {opts.token}"} if opts.token else {}

# %%
# Upload: the body is streamed from the file; the answer comes at once with the links.
with open(opts.file, "rb") as f:
    r = requests.post(f"{BASE}/api/v1/snapshots", data=f, params={"name": opts.file.split("/")[-1]}, headers=AUTH)
r.raise_for_status()
created = r.json()
print("page:", BASE + created["page_url"])

# %%
# Wait for the analysis (progress is the share of the file parsed so far).
while True:
    status = requests.get(BASE + created["status_url"]).json()
    if status["status"] in ("ready", "failed"):
        break
    time.sleep(0.2)
if status["status"] == "failed":
    sys.exit(f"analysis failed: {status['error']}")
analysis = requests.get(f"{BASE}/api/v1/snapshots/{created['id']}/analysis").json()
device = analysis["devices"][0]
print("verdict:", device["diagnosis"]["verdict"])
print(device["diagnosis"]["summary"])

# %%
# The timeline as a DataFrame: one row per bucket of events, min and max of each series.
# (format=bin gives the same numbers as little-endian f64 columns, 6x smaller than JSON.)
t = requests.get(f"{BASE}/api/v1/snapshots/{created['id']}/devices/{device['device']}/timeline", params={"points": 2000}).json()
timeline = pd.DataFrame({"event": t["event"], "time_us": t["time_us"]})
for name, s in t["series"].items():
    timeline[name + "_max"] = s["max"]
    timeline[name + "_min"] = s["min"]
print("timeline:", len(timeline), "rows")
print(timeline[["event", "reserved_bytes_max", "allocated_bytes_max", "pinned_free_bytes_max"]].tail())

# %%
# Who pins the free memory at the end (or pass event=N), ranked by pinned bytes.
p = requests.get(f"{BASE}/api/v1/snapshots/{created['id']}/devices/{device['device']}/pinners").json()
pinners = pd.DataFrame(
    [
        {
            "call_site": f"{x['call_site']['filename']}:{x['call_site']['line']} ({x['call_site']['name']})" if x["call_site"] else None,
            "blocks": x["blocks"],
            "live_bytes": x["live_bytes"],
            "pinned_free_bytes": x["pinned_free_bytes"],
        }
        for x in p["pinners"]
    ],
    columns=["call_site", "blocks", "live_bytes", "pinned_free_bytes"],
)
print("pinners:", len(pinners), "rows")
print(pinners.head())

# %%
# What to change.
for remedy in device["diagnosis"]["remedies"]:
    mark = "APPLIES" if remedy["applies"] else "does not apply"
    print(f"- {remedy['kind']} ({mark}): {remedy['setting_or_code'].splitlines()[0] if remedy['setting_or_code'] else ''}")
    print(f"    {remedy['why']}")
