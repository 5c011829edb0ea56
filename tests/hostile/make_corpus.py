#!/usr/bin/env python3
"""Writes the hostile-input corpus beside this script. Run it again after changing it; the
outputs are committed so the tests need no Python to exist. Each file is one kind of attack;
tests/integration/hostile.rs names the error each one must get."""
import gzip, json, os, pickle, random, struct

here = os.path.dirname(os.path.abspath(__file__))


def write(name, data):
    with open(os.path.join(here, name), "wb") as f:
        f.write(data)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/fragscope-pwned",))


# A pickle that imports os.system and calls it: GLOBAL + REDUCE (protocol 2) ...
write("global_reduce.pickle", pickle.dumps(Evil(), protocol=2))
# ... and the protocol 4 form: STACK_GLOBAL.
write("stack_global.pickle", pickle.dumps({"segments": [Evil()]}, protocol=4))
# A string whose length prefix claims 2**62 bytes.
write("huge_length.pickle", b"\x80\x04\x8d" + struct.pack("<Q", 1 << 62) + b"abc.")
# A string that claims 1 GB (under 2**32, over the per-string cap), with 3 bytes behind it.
write("gigabyte_string.pickle", b"\x80\x04X" + struct.pack("<I", 1 << 30) + b"abc.")
# 100,000 nested lists: [[[[...]]]]
write("deep_nesting.pickle", b"\x80\x04" + b"]" * 100_000 + b"a" * 99_999 + b".")
# A memo get of an index that was never put.
write("memo_missing.pickle", b"\x80\x04}\x94(\x8c\x08segments\x94j\x07\x00\x00\x00u.")
# A gzip bomb: a valid pickle prefix, then NONE/POP pairs forever: 1 GiB unpacked.
with gzip.GzipFile(os.path.join(here, "gzip_bomb.pickle.gz"), "wb", compresslevel=9, mtime=0) as g:
    g.write(b"\x80\x04")
    chunk = b"N0" * (1 << 20)
    for _ in range(512):
        g.write(chunk)
# JSON with the right keys and the wrong types.
write("json_wrong_types.json", json.dumps({"segments": [{"address": "0x7f00", "total_size": 2097152, "blocks": []}]}).encode())
# JSON nested 1,000,000 deep.
write("json_deep.json", b"[" * 1_000_000)
write("empty.pickle", b"")
random.seed(7)
write("random.bin", bytes(random.getrandbits(8) for _ in range(4096)))
# A valid pickle that is not a snapshot.
write("not_a_snapshot.pickle", pickle.dumps({"weights": [1.0, 2.0], "epoch": 3}, protocol=4))
# A snapshot whose trace entry has a str where an int belongs.
write("trace_wrong_type.pickle", pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": "big", "stream": 0}]]}, protocol=4))
# A truncated real-shaped snapshot (the end cut off).
write("truncated.pickle", pickle.dumps({"segments": [{"address": 1 << 40, "total_size": 2 << 20, "blocks": [{"size": 2 << 20, "state": "inactive"}]}], "device_traces": [[]]}, protocol=4)[:-9])
# A snapshot that contradicts itself: a block larger than its segment, overlapping segments,
# a free of an address never allocated, an alloc outside every segment.
G = 1 << 30
contradictory = {
    "segments": [
        {"device": 0, "address": 1 << 40, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
         "blocks": [{"address": 1 << 40, "size": 8 << 20, "state": "active_allocated", "frames": []}]},
        {"device": 0, "address": (1 << 40) + (1 << 20), "total_size": 20 << 20, "stream": 0, "segment_type": "large",
         "blocks": [{"size": 20 << 20, "state": "inactive", "frames": []}]},
        {"device": 0, "address": 2 << 40, "total_size": G, "stream": 0, "segment_type": "large",
         "blocks": [{"size": 600 << 20, "state": "active_allocated", "frames": []}, {"size": 424 << 20, "state": "inactive", "frames": []}]},
    ],
    "device_traces": [[
        {"action": "free_completed", "addr": 12345, "size": 512, "stream": 0, "time_us": 1},
        {"action": "alloc", "addr": 3 << 40, "size": 1 << 20, "stream": 0, "time_us": 2},
        {"action": "segment_free", "addr": 5 << 40, "size": G, "stream": 0, "time_us": 3},
        {"action": "oom", "device_free": 0, "size": G, "stream": 0, "time_us": 4},
    ]],
}
write("contradictory.pickle", pickle.dumps(contradictory, protocol=4))
# A zstd frame that claims 100 GB of content and holds a 4-byte pickle: frame header with an
# 8-byte content size (single segment), then one raw last block.
body = b"\x80\x04N."
frame = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", 100 * 10**9)
frame += struct.pack("<I", (len(body) << 3) | 1)[:3] + body
write("zstd_claims_100gb.pickle.zst", frame)

# Expansion: small files whose shared (memo) objects would expand to gigabytes of model.
# One segment listed 100,000 times, its one block listed 4,000 times in it (about 500 KB).
block = {"address": 1 << 40, "size": 512, "requested_size": 512, "state": "inactive", "frames": []}
segment = {"device": 0, "address": 1 << 40, "total_size": 2 << 20, "stream": 0, "segment_type": "small",
           "blocks": [block] * 4000}
write("shared_segments.pickle", pickle.dumps({"segments": [segment] * 100_000, "device_traces": [[]]}, protocol=4))
# One trace entry listed 200,000 times.
entry = {"action": "alloc", "addr": 1 << 40, "size": 512, "stream": 0, "time_us": 1, "frames": []}
write("shared_trace.pickle", pickle.dumps({"segments": [], "device_traces": [[entry] * 200_000]}, protocol=4))
# More segments than any GPU holds: 140,000 distinct 2 MiB segments (gzip keeps the file small).
many = [{"device": 0, "address": (1 << 40) + i * (2 << 20), "total_size": 2 << 20, "stream": 0,
         "segment_type": "small", "blocks": [{"size": 2 << 20, "state": "inactive"}]} for i in range(140_000)]
with gzip.GzipFile(os.path.join(here, "many_segments.pickle.gz"), "wb", compresslevel=9, mtime=0) as g:
    g.write(pickle.dumps({"segments": many, "device_traces": [[]]}, protocol=4))
# More blocks than a segment has room for: 5,000 distinct blocks in 2 MiB.
crowded = {"device": 0, "address": 1 << 40, "total_size": 2 << 20, "stream": 0, "segment_type": "small",
           "blocks": [{"size": 512, "state": "inactive", "address": (1 << 40) + 512 * i} for i in range(5000)]}
write("crowded_segment.pickle", pickle.dumps({"segments": [crowded], "device_traces": [[]]}, protocol=4))
# A size of 2**63: past what an allocator can hand out.
write("huge_total_size.pickle", pickle.dumps({"segments": [{"address": 1 << 40, "total_size": 1 << 63, "blocks": []}]}, protocol=4))
# A trace entry with 5,000 keys.
wide = {"action": "alloc", "addr": 1, "size": 512, "stream": 0}
wide.update({f"k{i}": i for i in range(5000)})
write("trace_many_keys.pickle", pickle.dumps({"segments": [], "device_traces": [[wide]]}, protocol=4))
# 20,000 OOMs over a segment of 10,000 blocks (alternately live and free): a valid snapshot whose
# per-OOM work must be capped (the first OOMs in full, the rest counted).
base = 1 << 40
blocks = [{"address": base + i * 4096, "size": 4096, "requested_size": 4096,
           "state": "active_allocated" if i % 2 else "inactive", "frames": []} for i in range(10_000)]
storm = {"segments": [{"device": 0, "address": base, "total_size": 10_000 * 4096, "stream": 0,
                       "segment_type": "large", "blocks": blocks}],
         "device_traces": [[{"action": "oom", "addr": 0, "size": 64 << 20, "stream": 0, "time_us": i, "frames": []}
                            for i in range(20_000)]]}
write("oom_storm.pickle", pickle.dumps(storm, protocol=4))
# A million distinct 512-byte live blocks in 1,000 segments: a valid-shaped snapshot of 32 MB
# that zstd packs into 385 KB, whose read and analysis would take about a GB. Charged to the
# memory budget block by block and refused by name, not parsed until memory runs out.
import subprocess
base = 1 << 40
segs = [{"device": 0, "address": base + s * (4 << 20), "total_size": 512 * 1000, "stream": 0, "segment_type": "large",
         "blocks": [{"address": base + s * (4 << 20) + 512 * i, "size": 512, "requested_size": 512,
                     "state": "active_allocated", "frames": []} for i in range(1000)]} for s in range(1000)]
raw = pickle.dumps({"segments": segs, "device_traces": [[]]}, protocol=4)
write("many_blocks.pickle.zst", subprocess.run(["zstd", "-19", "-q", "-c"], input=raw, capture_output=True, check=True).stdout)
# 100,000 devices of one segment each: a process sees a few dozen at most.
devices = [{"device": d, "address": 1 << 40, "total_size": 2 << 20, "stream": 0, "segment_type": "small",
            "blocks": [{"size": 2 << 20, "state": "inactive"}]} for d in range(100_000)]
with gzip.GzipFile(os.path.join(here, "many_devices.pickle.gz"), "wb", compresslevel=9, mtime=0) as g:
    g.write(pickle.dumps({"segments": devices, "device_traces": [[] for _ in range(100_000)]}, protocol=4))
