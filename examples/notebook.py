# fragscope from a notebook: upload a snapshot, wait for the analysis, and load the timeline
# and the pinners into pandas, with the Python client. The same cells are in notebook.ipynb.
#
#   python3 examples/notebook.py --url http://127.0.0.1:8080 --file snapshot.pickle [--token T]
#
# Needs: pip install ./clients/python pandas

# %%
import argparse
import os
import sys

try:
    import fragscope
except ImportError:  # run from the repository without installing the client
    here = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.path.join(os.getcwd(), "examples")
    sys.path.insert(0, os.path.join(here, "..", "clients", "python"))
    import fragscope

args = argparse.ArgumentParser()
args.add_argument("--url", default="http://127.0.0.1:8080")
args.add_argument("--file", required=True)
args.add_argument("--token", default=None)
opts = args.parse_args(sys.argv[1:] if "ipykernel" not in sys.modules else ["--file", "snapshot.pickle"])
client = fragscope.Client(opts.url, token=opts.token)

# %%
# Upload (the answer comes at once with the link), then wait for the analysis.
snap = client.upload(opts.file, name=os.path.basename(opts.file))
print("page:", snap.page_url)
snap.wait()
diagnosis = snap.diagnosis()
print("verdict:", diagnosis["verdict"])
print(diagnosis["summary"])
need = diagnosis["need"]
if need.get("peak_reserved_bytes") is not None:
    fits = {True: "fits", False: "does not fit"}.get(need.get("fits"), "cannot tell")
    print(f"the step needs {need['peak_reserved_bytes'] / 2**30:.2f} GiB reserved; budget "
          f"{(need.get('budget_bytes') or 0) / 2**30:.2f} GiB: {fits}")

# %%
# The timeline as a DataFrame: one row per bucket of events, min and max of each series.
timeline = snap.timeline(points=2000, frame=True)
print("timeline:", len(timeline), "rows")
print(timeline[["event", "reserved_bytes_max", "allocated_bytes_max", "pinned_free_bytes_max"]].tail())

# %%
# Who pins the free memory at the end (or pass event=N), ranked by pinned bytes.
pinners = snap.pinners(frame=True)
print("pinners:", len(pinners), "rows")
print(pinners.head())

# %%
# Memory that grows step after step (a leak), with its cause where the trace tells.
for device in snap.analysis()["devices"]:
    for g in device.get("growth", []):
        site = g["call_site"] or {}
        print(f"growth on cuda:{device['device']}: {g['bytes_per_step'] / 2**20:.1f} MiB a step at "
              f"{site.get('filename')}:{site.get('line')} ({g['category']}, cause: {g.get('cause') or 'not told'})")

# %%
# What to change.
# Each remedy's effect: fixes, helps (not enough), does not help, does not apply.
for remedy in diagnosis["remedies"]:
    effect = (remedy.get("effect") or ("applies" if remedy["applies"] else "does_not_apply")).replace("_", " ")
    print(f"- {remedy['kind']} ({effect}): {remedy['setting_or_code'].splitlines()[0] if remedy['setting_or_code'] else ''}")
    print(f"    {remedy['why']}")
    if remedy.get("predicted"):
        print(f"    predicted: {remedy['predicted']}")
