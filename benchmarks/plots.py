"""PNG plots of ``benchmarks.compare`` (and ``benchmarks.bench_restore``) JSON output.

    python benchmarks/plots.py bench-out/compare.json [bench-out/restore.json] [--out DIR]

Needs matplotlib (``pip install .[bench]``). Three plots:

* ``throughput_vs_keys.png``: events/s of the count workload against the number of keys,
  one line per system (use ``compare --sweep-keys`` for more than one point per line).
* ``bytes_per_checkpoint.png``: durable bytes written per micro-batch against the batch
  number, one line per stateful system (count workload, largest key count).
* ``restore_vs_state.png``: restart time against state size on disk, one point per run;
  with a ``bench_restore`` JSON also restore time by source against state size.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:  # an empty legend only warns
        ax.legend(fontsize=7)


def _load(path: str) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def plot_compare(path: str, out_dir: str, restore_json: str | None = None) -> list[str]:
    """Write the three plots from a compare JSON; returns the PNG paths."""
    data = _load(path)
    results = data["results"]
    os.makedirs(out_dir, exist_ok=True)
    written = []

    # throughput vs keys
    fig, ax = plt.subplots(figsize=(8, 5))
    by_system: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        if r["workload"] == "count":
            by_system.setdefault(r["system"], []).append((r["keys"], r["events_per_s"]))
    for name, pts in sorted(by_system.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys")
    ax.set_ylabel("events/s (count workload)")
    ax.set_title("Throughput vs number of keys")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax)
    p = os.path.join(out_dir, "throughput_vs_keys.png")
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    # bytes per checkpoint vs batch
    fig, ax = plt.subplots(figsize=(8, 5))
    counts = [r for r in results if r["workload"] == "count" and r.get("bytes_per_batch")]
    if counts:
        kmax = max(r["keys"] for r in counts)
        for r in counts:
            if r["keys"] == kmax:
                ys = r["bytes_per_batch"]
                ax.plot(range(len(ys)), [y / 1024 for y in ys], marker=".", label=r["system"])
        ax.set_title(f"Durable bytes written per batch (count, {kmax:,} keys)")
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("kB written")
    ax.set_yscale("symlog")
    ax.grid(True, alpha=0.3)
    _legend(ax)
    p = os.path.join(out_dir, "bytes_per_checkpoint.png")
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    # restore time vs state size
    fig, ax = plt.subplots(figsize=(8, 5))
    pts_by: dict[str, list[tuple[float, float]]] = {}
    for r in results:
        if r.get("restart_ms") and r.get("state_bytes"):
            pts_by.setdefault(r["system"], []).append((r["state_bytes"] / 2**20, r["restart_ms"]))
    for name, pts in sorted(pts_by.items()):
        ax.scatter([q[0] for q in pts], [q[1] for q in pts], label=f"{name} (restart batch)", s=18)
    if restore_json and os.path.exists(restore_json):
        rs = _load(restore_json)["results"]
        for source in sorted({r["source"] for r in rs}):
            pts = sorted((r["state_bytes"] / 2**20, r["restore_ms"]) for r in rs
                         if r["source"] == source)
            ax.plot([q[0] for q in pts], [q[1] for q in pts], marker="s",
                    label=f"ours restore from {source}")
    ax.set_xscale("symlog")
    ax.set_xlabel("state size on disk (MB)")
    ax.set_ylabel("ms")
    ax.set_title("Restore time vs state size")
    ax.grid(True, alpha=0.3)
    _legend(ax)
    p = os.path.join(out_dir, "restore_vs_state.png")
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = "bench-out"
    if "--out" in args:
        i = args.index("--out")
        out = args[i + 1]
        del args[i:i + 2]
    if not args:
        print(__doc__)
        return 2
    for p in plot_compare(args[0], out, args[1] if len(args) > 1 else None):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
