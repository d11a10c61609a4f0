#!/usr/bin/env python3
"""Regenerate crates/ep/tests/data/deepep_routing_* from torch's own RNG.

DeepEP's internode test (and seed 002's `print_bw_values.py`, which mirrors it) builds the
routing of rank r as follows: seed torch's CPU generator with r, draw a [T, hidden] bf16
normal tensor (unused, but it advances the generator), draw [T, E] f32 normal scores and
take |s| + 1, keep the top min(nodes, 4) node groups of each token by their best score,
zero the other groups, and take the top-K experts (`sorted=False`). This script replays
that call sequence for every rank in one process (no process group is needed: the
generator state depends only on the seed and the calls), then writes

  <out>/deepep_routing_2x8.u8    topk_idx of all ranks as uint8, rank-major
                                  ([world][T][K], torch's own slot order);
  <out>/deepep_routing_2x8.json  the configuration and, per rank, the counts seed 002
                                  reports: RDMA algo tokens (unique (token, node) pairs,
                                  local node included), RDMA physical tokens (own node
                                  excluded), tokens sent to each rank, tokens received.

With --check-log LOG it also parses the output of seed 002's print_bw_values.py run on
the same configuration and exits non-zero unless every rank's recv_num_tokens and algo and
physical RDMA counts equal ours.

Needs torch (CPU is enough). Example:
  python3 tools/deepep_routing.py --out crates/ep/tests/data
"""

import argparse
import hashlib
import json
import lzma
import re
import sys
from pathlib import Path

import torch


def routing_of_rank(rank, num_tokens, hidden, num_experts, num_nodes, num_topk):
    """topk_idx [T, K] int64 of one rank, drawn exactly as DeepEP's test draws it."""
    torch.manual_seed(rank)
    # Unused activations: drawn only so the scores come from the same generator state.
    torch.randn((num_tokens, hidden), dtype=torch.bfloat16)
    scores = torch.randn((num_tokens, num_experts), dtype=torch.float32).abs() + 1
    by_node = scores.view(num_tokens, num_nodes, -1)
    best_per_node = by_node.amax(dim=-1)
    groups = torch.topk(best_per_node, k=min(num_nodes, 4), dim=-1, sorted=False).indices
    keep = torch.zeros((num_tokens, num_nodes), dtype=torch.bool).scatter_(1, groups, True)
    masked = (by_node * keep.unsqueeze(-1)).view(num_tokens, num_experts)
    return torch.topk(masked, num_topk, dim=-1, largest=True, sorted=False).indices.to(torch.int64)


def presence(dest, num_dest):
    """[T, num_dest] bool: does the token go to destination d at least once."""
    return torch.zeros((dest.size(0), num_dest), dtype=torch.bool).scatter_(1, dest, True)


def parse_seed_log(text):
    """{rank: (recv, algo, physical)} from print_bw_values.py's output."""
    out = {}
    for block in re.split(r"\n(?=\[rank )", text):
        m = re.match(r"\[rank\s+(\d+)", block)
        if not m:
            continue
        def field(name):
            f = re.search(re.escape(name) + r"\s*=\s*(\d+)", block)
            if not f:
                sys.exit(f"seed log: rank {m.group(1)} has no '{name}' line")
            return int(f.group(1))
        out[int(m.group(1))] = (
            field("recv_num_tokens"),
            field("num_rdma_token_sent (algo)"),
            field("num_rdma_token_sent (physical)"),
        )
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-nodes", type=int, default=2)
    p.add_argument("--gpu-per-node", type=int, default=8)
    p.add_argument("--num-tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--num-experts", type=int, default=256)
    p.add_argument("--num-topk", type=int, default=8)
    p.add_argument("--out", type=Path, required=True, help="directory for the .u8 and .json files")
    p.add_argument("--name", default="deepep_routing_2x8", help="file stem (default: %(default)s)")
    p.add_argument("--check-log", type=Path, help="print_bw_values.py output to compare against")
    a = p.parse_args()

    world = a.num_nodes * a.gpu_per_node
    if a.num_experts % world:
        sys.exit(f"--num-experts {a.num_experts} is not a multiple of the world size {world}")
    if a.num_experts > 256:
        sys.exit(f"--num-experts {a.num_experts} does not fit the uint8 fixture (at most 256)")
    per_node, per_rank = a.num_experts // a.num_nodes, a.num_experts // world

    blobs, ranks = [], []
    to_rank = torch.zeros((world, world), dtype=torch.int64)  # [sender][destination]
    for r in range(world):
        idx = routing_of_rank(r, a.num_tokens, a.hidden, a.num_experts, a.num_nodes, a.num_topk)
        blobs.append(bytes(idx.flatten().tolist()))
        nodes = presence(idx // per_node, a.num_nodes)
        my_node = r // a.gpu_per_node
        algo = int(nodes.sum())
        physical = algo - int(nodes[:, my_node].sum())
        to_rank[r] = presence(idx // per_rank, world).sum(dim=0)
        ranks.append({"rank": r, "node": my_node, "rdma_algo_tokens": algo, "rdma_physical_tokens": physical})
    recv = to_rank.sum(dim=0)
    for r, entry in enumerate(ranks):
        entry["tokens_to_rank"] = to_rank[r].tolist()
        entry["recv_tokens"] = int(recv[r])

    raw = b"".join(blobs)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.u8").write_bytes(raw)
    meta = {
        "generator": "tools/deepep_routing.py",
        "torch": torch.__version__,
        "num_nodes": a.num_nodes,
        "gpu_per_node": a.gpu_per_node,
        "num_tokens": a.num_tokens,
        "hidden": a.hidden,
        "num_experts": a.num_experts,
        "num_topk": a.num_topk,
        "fixture": f"{a.name}.u8",
        "fixture_layout": "uint8 expert ids, [rank][token][slot], torch.topk(sorted=False) slot order",
        "fixture_bytes": len(raw),
        "fixture_sha256": hashlib.sha256(raw).hexdigest(),
        "ranks": ranks,
    }
    (a.out / f"{a.name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {len(raw)} bytes (xz would give {len(lzma.compress(raw, preset=9))}), sha256 {meta['fixture_sha256']}")
    for e in ranks:
        print(f"rank {e['rank']:2d}: recv {e['recv_tokens']} algo {e['rdma_algo_tokens']} physical {e['rdma_physical_tokens']}")

    if a.check_log:
        seed = parse_seed_log(a.check_log.read_text())
        if sorted(seed) != list(range(world)):
            sys.exit(f"seed log lists ranks {sorted(seed)}, expected 0..{world - 1}")
        bad = [
            (e["rank"], seed[e["rank"]], (e["recv_tokens"], e["rdma_algo_tokens"], e["rdma_physical_tokens"]))
            for e in ranks
            if seed[e["rank"]] != (e["recv_tokens"], e["rdma_algo_tokens"], e["rdma_physical_tokens"])
        ]
        for r, s, o in bad:
            print(f"MISMATCH rank {r}: seed (recv, algo, physical) = {s}, ours = {o}")
        if bad:
            sys.exit(1)
        print(f"check: all {world} ranks equal print_bw_values.py (recv, algo, physical)")


if __name__ == "__main__":
    main()
