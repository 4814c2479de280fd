#!/usr/bin/env python3
"""Fails when Kiln fell far behind a peer since the ratios were recorded.

Reads a results file of the comparative benchmark (bench/, `--out`) and the
ratios recorded in the repository (bench/ratios-recorded.json), and compares, row
by row and peer by peer, Kiln's speed over the peer's measured in the same run
(> 1: Kiln ahead, whichever way the unit goes) with the recorded one. A ratio that
fell by MAX_FALL or more (default 0.4: a fall to 0.6x of the recorded ratio, the
size of the regression issue 50 found; a quick run's noise on a shared 2-core
machine stays well inside it) fails the check. Rows or peers missing from the run
(a peer not built, a workload not run) are listed and skipped, not failed.

    python3 bench/scripts/check_ratios.py RESULTS.json [bench/ratios-recorded.json] [--max-fall 0.4]
    python3 bench/scripts/check_ratios.py RESULTS.json --record OUT.json   # write the recording
"""

import argparse
import json
import sys


def ratios(results):
    """{row: {peer: Kiln/peer}} from a results file, each > 1 when Kiln is ahead."""
    out = {}
    for row in results.get("results", []):
        engines = row.get("engines", {})
        kiln = engines.get("kiln", {}).get("median")
        if not kiln:
            continue
        lower = row.get("lower_is_better", False)
        for peer, cell in engines.items():
            m = cell.get("median") if isinstance(cell, dict) else None
            if peer == "kiln" or not m:
                continue
            out.setdefault(row["row"], {})[peer] = m / kiln if lower else kiln / m
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("recorded", nargs="?", default="bench/ratios-recorded.json")
    ap.add_argument("--max-fall", type=float, default=0.4)
    ap.add_argument("--record", metavar="OUT",
                    help="record this run's ratios in OUT; where OUT holds one already, the "
                         "lower of the two is kept (record several runs: a lucky run must "
                         "not become the bar)")
    ap.add_argument("--rows", default="W3 ,W4 ",
                    help="with --record: the rows to record, by prefix (default: the random "
                         "fills W3 and W4, where issue 50's regression was; in four --quick "
                         "runs on the shared 2-core VM, W5's scans and gets and W2 moved by "
                         "more than 40%% between runs, as the durable-commit rows W1/W6 and "
                         "the server rows do with the disk's and the machine's load)")
    ap.add_argument("--peers", default="fjall",
                    help="with --record: the peers to record (default: fjall, the LSM tree, "
                         "whose fills run long enough in a quick run to be steady)")
    args = ap.parse_args()
    with open(args.results) as f:
        now = ratios(json.load(f))
    if not now:
        print(f"check_ratios: no Kiln/peer ratio in {args.results}", file=sys.stderr)
        return 1
    if args.record:
        prefixes = [p for p in args.rows.split(",") if p]
        peers = set(args.peers.split(","))
        now = {
            r: {p: v for p, v in ps.items() if p in peers}
            for r, ps in now.items()
            if any(r.startswith(x) for x in prefixes)
        }
        try:
            with open(args.record) as f:
                kept = json.load(f)["ratios"]
        except FileNotFoundError:
            kept = {}
        for row, peers in now.items():
            for peer, r in peers.items():
                old = kept.setdefault(row, {}).get(peer)
                kept[row][peer] = r if old is None else min(old, r)
        now = kept
        with open(args.record, "w") as f:
            json.dump({"ratios": now}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"check_ratios: {sum(len(p) for p in now.values())} ratios written to {args.record}")
        return 0
    with open(args.recorded) as f:
        recorded = json.load(f)["ratios"]
    failed, skipped = [], []
    print(f"{'row':<32} {'peer':<10} {'recorded':>9} {'now':>8} {'now/rec':>8}")
    for row, peers in sorted(recorded.items()):
        for peer, then in sorted(peers.items()):
            r = now.get(row, {}).get(peer)
            if r is None:
                skipped.append(f"{row} vs {peer}")
                continue
            rel = r / then
            mark = "  FELL" if rel <= 1 - args.max_fall else ""
            print(f"{row:<32} {peer:<10} {then:>8.2f}x {r:>7.2f}x {rel:>7.2f}{mark}")
            if mark:
                failed.append(f"{row} vs {peer}: {r:.2f}x, recorded {then:.2f}x")
    if skipped:
        print(f"not in this run (skipped): {', '.join(skipped)}")
    if failed:
        print(f"check_ratios: Kiln fell {args.max_fall:.0%} or more against a peer since the "
              f"recording ({args.recorded}):", file=sys.stderr)
        for f_ in failed:
            print(f"  {f_}", file=sys.stderr)
        return 1
    print(f"check_ratios: no ratio fell {args.max_fall:.0%} or more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
