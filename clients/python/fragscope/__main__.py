"""`python -m fragscope upload FILES... --url U [--run KEY] [--token T]`: upload snapshot files
as one run, ranks from `rank<N>` in the file names (else their order)."""

import argparse
import os
import re
import secrets
import sys

from .upload import default_run, upload


def ranks_of(files):
    found = [re.search(r"rank[_-]?(\d+)", os.path.basename(f), re.IGNORECASE) for f in files]
    if all(found) and len({m.group(1) for m in found}) == len(files):
        return [int(m.group(1)) for m in found]
    return list(range(len(files)))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fragscope")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upload", help="upload snapshot files (several make one run)")
    up.add_argument("files", nargs="+")
    up.add_argument("--url", default=os.environ.get("FRAGSCOPE_URL", "http://127.0.0.1:8080"))
    up.add_argument("--token", default=os.environ.get("FRAGSCOPE_TOKEN"))
    up.add_argument("--run", help="the run key (default: the launcher's job id; several files: a new key)")
    up.add_argument("--fallback-dir", default=None)
    args = parser.parse_args(argv)
    run = args.run or default_run()
    if run is None and len(args.files) > 1:
        run = f"cli-{secrets.token_hex(8)}"
    ranks = ranks_of(args.files) if run is not None else [None] * len(args.files)
    failed, run_url = 0, None
    for path, rank in zip(args.files, ranks):
        try:
            d = upload(path, args.url, token=args.token, run=run, rank=rank, fallback_dir=args.fallback_dir, quiet=True)
        except OSError as e:
            print(f"{path}: {e}", file=sys.stderr)
            failed += 1
            continue
        if d.ok:
            run_url = d.run_url or run_url
            print(f"{path}: {d.page_url}")
        else:
            failed += 1
            print(f"{path}: {d.error}; saved to {d.saved}", file=sys.stderr)
    if run_url:
        print(f"run: {run_url}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
