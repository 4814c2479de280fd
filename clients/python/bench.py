#!/usr/bin/env python3
"""The Python client's benchmark (issue 20).

1. Loading the same 100 documents over and over (by default 10,000 loads: 100 passes
   over the 100 documents, one session per pass) in three modes:
   - plain:      no HTTP cache, every load is a 200 with the body;
   - revalidate: the HTTP cache, every load is a 304 (If-None-Match, no body);
   - aggressive: `store.aggressive_caching()`, loads are answered from the cache while
                 the changes feed says nothing changed (no request at all).
   Reported as loads per second.
2. Bulk insert from Python: ~300-byte generated documents shaped like W10's (`kiln
   bench --workloads W10`), streamed over one connection; documents per second.
   With --rust-w10 the same number of documents is also inserted by `kiln bench`'s
   W10 (Rust) for comparison.

Starts its own `kiln serve` on a free port in a temporary directory (KILN_BIN, else
<repo>/target/release/kiln), unless --url is given. Prints a table, or JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))
from kiln_client import DocumentStore  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def kiln_bin() -> str:
    env = os.environ.get("KILN_BIN")
    if env:
        return env
    path = REPO / "target" / "release" / "kiln"
    if not path.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "kiln-cli"], cwd=REPO, check=True)
    return str(path)


class Server:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="kiln-pybench-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [kiln_bin(), "serve", "--data-dir", os.path.join(self.dir, "data"),
             "--bind", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("kiln serve did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def load_loop(store: DocumentStore, ids: List[str], passes: int,
              aggressive: bool = False) -> Dict[str, Any]:
    def run() -> None:
        for _ in range(passes):
            with store.session(max_requests=len(ids)) as s:
                for i in ids:
                    s.load(i)

    # One warm-up pass fills the cache (and, for aggressive, connects the feed).
    with store.session(max_requests=len(ids)) as s:
        for i in ids:
            s.load(i)
    requests_before = store.stats.requests
    t0 = time.perf_counter()
    if aggressive:
        with store.aggressive_caching(duration=3600):
            run()
    else:
        run()
    dt = time.perf_counter() - t0
    loads = passes * len(ids)
    return {"loads": loads, "seconds": round(dt, 3), "loads_per_sec": round(loads / dt),
            "http_requests": store.stats.requests - requests_before}


def bulk(url: str, db: str, docs: int) -> Dict[str, Any]:
    rng = random.Random(0x4B494C4E)
    payloads = ["".join(rng.choice(string.ascii_lowercase) for _ in range(150))
                for _ in range(1000)]
    with DocumentStore(url, db) as store:
        store.create_database()
        t0 = time.perf_counter()
        with store.bulk_insert() as b:
            for n in range(docs):
                b.store({"name": f"item-{n}", "n": n, "tag": f"tag-{n % 100}",
                         "email": f"user{n}@example.com", "active": n % 3 != 0,
                         "payload": payloads[n % 1000]}, f"items/{n:09}")
        dt = time.perf_counter() - t0
        assert b.acked == docs, (b.acked, docs)
    return {"documents": docs, "seconds": round(dt, 3), "docs_per_sec": round(docs / dt),
            "acks": b.acks}


def rust_w10(docs: int) -> Optional[Dict[str, Any]]:
    d = tempfile.mkdtemp(prefix="kiln-pybench-w10-")
    try:
        out = subprocess.run(
            [kiln_bin(), "bench", "--workloads", "W10", "--w10-docs", str(docs), "--runs", "1",
             "--json", "--dir", d], capture_output=True, text=True, check=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    for line in out.stdout.splitlines():
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if isinstance(v, dict) and str(v.get("workload", "")).upper().startswith("W10"):
            return v
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an existing server (default: start one)")
    ap.add_argument("--docs", type=int, default=100, help="documents loaded over and over")
    ap.add_argument("--loads", type=int, default=10_000, help="loads per mode in total")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each mode (median shown)")
    ap.add_argument("--bulk-docs", type=int, default=100_000)
    ap.add_argument("--rust-w10", action="store_true",
                    help="also run `kiln bench --workloads W10` with --bulk-docs documents")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    server = None if a.url else Server()
    url = a.url or server.url  # type: ignore[union-attr]
    try:
        results: Dict[str, Any] = {"loads": a.loads, "documents": a.docs}
        ids = [f"users/{i}" for i in range(a.docs)]
        passes = max(1, a.loads // a.docs)
        seed = DocumentStore(url, "pybench")
        seed.create_database()
        with seed.bulk_insert() as b:
            for i in ids:
                b.store({"name": f"user {i}", "age": 20 + len(i), "bio": "x" * 200}, i)
        seed.close()
        # The modes take turns, --rounds times; the median round of each is reported
        # (the machine is shared and noisy).
        runs: Dict[str, List[Dict[str, Any]]] = {"plain": [], "revalidate_304": [],
                                                 "aggressive": []}
        for _ in range(a.rounds):
            with DocumentStore(url, "pybench", cache_size_bytes=0) as st:
                runs["plain"].append(load_loop(st, ids, passes))
            with DocumentStore(url, "pybench") as st:
                runs["revalidate_304"].append(load_loop(st, ids, passes))
            with DocumentStore(url, "pybench") as st:
                runs["aggressive"].append(load_loop(st, ids, passes, aggressive=True))
        for mode, rs in runs.items():
            rs.sort(key=lambda r: r["loads_per_sec"])
            results[mode] = dict(rs[len(rs) // 2],
                                 all_loads_per_sec=[r["loads_per_sec"] for r in rs],
                                 all_http_requests=[r["http_requests"] for r in rs])
        results["bulk_insert"] = bulk(url, "pybulk", a.bulk_docs)
        if a.rust_w10:
            w = rust_w10(a.bulk_docs)
            if w is not None:
                results["rust_w10"] = w
    finally:
        if server is not None:
            server.stop()

    if a.json:
        print(json.dumps(results))
        return
    print(f"loading the same {a.docs} documents, {passes * a.docs} loads per mode "
          f"(one session per pass over the {a.docs}):")
    print(f"  {'mode':<16}{'loads/s':>12}{'HTTP requests':>16}{'seconds':>10}   all rounds")
    for mode in ("plain", "revalidate_304", "aggressive"):
        r = results[mode]
        print(f"  {mode:<16}{r['loads_per_sec']:>12,}{r['http_requests']:>16,}{r['seconds']:>10}"
              f"   {r['all_loads_per_sec']}")
    b = results["bulk_insert"]
    print(f"bulk insert from Python: {b['documents']:,} ~300-byte documents in "
          f"{b['seconds']} s = {b['docs_per_sec']:,} docs/s ({b['acks']} acks)")
    if "rust_w10" in results:
        w = results["rust_w10"]
        print(f"kiln bench W10 (Rust), same count: {json.dumps(w)}")


if __name__ == "__main__":
    main()
