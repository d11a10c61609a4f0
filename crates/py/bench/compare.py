"""Reads scripts/gpu-parts/py.sh's JSON files and prints the issue's two checks:

- bandwidth: mori_rs >= 1.5x NIXL (both through Python, same harness, same call) at every point
  where NIXL is below 0.9x the same-run bare copy of the same shape;
- overhead: mori_rs through Python adds <= 1.5 us per batch-1 transfer over bench_engine: the
  median over ROUNDS alternating rounds of (mori_rs - bench_engine) latency per transfer.

Usage: python3 compare.py OUT_DIR ROUNDS
"""

import json
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def rows(path, key):
    return {key(r): r for r in load(path)["rows"]} if os.path.exists(path) else {}


def main():
    out, rounds = sys.argv[1], int(sys.argv[2])
    k3 = lambda r: (r["op"], r["batch"], r["msg_size"])  # noqa: E731
    mori, nixl = rows(os.path.join(out, "py-mori_rs.json"), k3), rows(os.path.join(out, "py-nixl.json"), k3)
    copy = rows(os.path.join(out, "py-copy.json"), lambda r: (r["batch"], r["msg_size"]))
    fails = []
    nan = float("nan")
    print("bandwidth (GB/s; latency per transfer in us), mori_rs and NIXL through Python, same call")
    hdr = f"{'op':5s} {'batch':>5s} {'size':>9s} | {'mori_rs us':>10s} {'GB/s':>8s} | {'nixl us':>10s} {'GB/s':>8s} | {'copy GB/s':>9s} | {'mori/nixl':>9s} {'nixl/copy':>9s}"
    print(hdr)
    print("-" * len(hdr))
    for key in sorted(mori, key=lambda k: (k[0] != "write", k[1], k[2])):
        op, b, size = key
        m, n, c = mori[key], nixl.get(key), copy.get((b, size))
        ratio = m["avg_bw_gbps"] / n["avg_bw_gbps"] if n else nan
        nc = n["avg_bw_gbps"] / c["avg_bw_gbps"] if n and c else nan
        print(
            f"{op:5s} {b:5d} {size:9d} | {m['avg_lat_us']:10.2f} {m['avg_bw_gbps']:8.2f} | "
            f"{n['avg_lat_us'] if n else nan:10.2f} {n['avg_bw_gbps'] if n else nan:8.2f} | "
            f"{c['avg_bw_gbps'] if c else nan:9.2f} | {ratio:9.2f} {nc:9.2f}"
        )
        if n and c and nc < 0.9 and ratio < 1.5:
            fails.append(f"{op} {b}x{size}: mori_rs/nixl {ratio:.2f} < 1.5 where nixl/copy {nc:.2f} < 0.9")
    print()
    print(f"batch-1 latency per transfer (us): mori_rs through Python against bench_engine, {rounds} alternating rounds")
    per = {}
    for r in range(1, rounds + 1):
        m = rows(os.path.join(out, f"py-ovh-mori_rs-{r}.json"), k3)
        for op in ("write", "read"):
            be = rows(os.path.join(out, f"py-ovh-be-{op}-{r}.json"), lambda x: x["msg_size"])
            for (o, b, size), row in m.items():
                if o == op and b == 1 and size in be:
                    per.setdefault((op, size), []).append((row["avg_lat_us"], be[size]["avg_lat_us"]))
    print(f"{'op':5s} {'size':>9s} | {'mori_rs (rounds)':>28s} | {'bench_engine (rounds)':>28s} | {'median diff':>11s}")
    for (op, size), v in sorted(per.items(), key=lambda kv: (kv[0][0] != "write", kv[0][1])):
        d = statistics.median(a - b for a, b in v)
        print(f"{op:5s} {size:9d} | {' '.join(f'{a:6.2f}' for a, _ in v):>28s} | {' '.join(f'{b:6.2f}' for _, b in v):>28s} | {d:+11.2f}")
        if d > 1.5:
            fails.append(f"{op} {size}: Python adds {d:.2f} us (median) over bench_engine (> 1.5)")
    print()
    print("targets:", "all met" if not fails else f"{len(fails)} missed")
    for f in fails:
        print("  MISSED", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
