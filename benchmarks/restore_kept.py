"""Restore a durable state kept by ``benchmarks.large_state --keep DIR``, again and again.

A restore's figures from the whole benchmark cost one run of it (4-5 minutes at 1 GiB,
15 at 5 GB) each; this restores the same durable state as often as asked, through the
same modelled object store (``benchmarks.latency_fs``), partitions one after the other
as the benchmark restores them, and prints each time against the benchmark's two floors.
Run it from two checkouts for an A/B of a restore change::

    PYTHONPATH=. python -m benchmarks.large_state --keys 1000000 --batches 100 \\
        --lifecycle open --keep /tmp/kept-1g
    PYTHONPATH=. python -m benchmarks.restore_kept /tmp/kept-1g --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile

from benchmarks import large_state, latency_fs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.restore_kept",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("kept", help="the directory given to large_state --keep")
    ap.add_argument("--repeat", type=int, default=1, help="restores, one after the other")
    ap.add_argument("--link", choices=["shared", "independent"], default=None,
                    help="the store's link model (default: the kept run's)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    path = os.path.join(args.kept, large_state.KEPT)
    try:
        with open(path) as fh:
            kept = json.load(fh)
    except FileNotFoundError:
        ap.error(f"{path} does not exist: keep a state with "
                 f"'python -m benchmarks.large_state ... --keep {args.kept}'")
    run_args = argparse.Namespace(**kept["args"])
    storage_options = dict(kept["storage_options"])
    if args.link:
        run_args.link = storage_options["link"] = args.link
    manifests = {int(p): m for p, m in kept["manifests"].items()}
    latency_fs.register()
    from statebackend.storage import open_store

    print(f"{args.kept}: {len(manifests)} partitions, {run_args.link} link, "
          f"{kept['logical_bytes'] / 1e6:.0f} MB logical; load {os.getloadavg()[0]:.1f}")
    times = []
    for i in range(args.repeat):
        local = tempfile.mkdtemp(prefix="sb-restore-kept-")
        opts = large_state.options_for(run_args, local, True)
        store = open_store(f"latency://{os.path.join(args.kept, 'durable')}",
                           storage_options=storage_options,
                           download_threads=opts.download_threads)
        try:
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            r = large_state.restore_manifests(store, manifests, opts, run_args,
                                              kept["logical_bytes"])
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            store.close()
            shutil.rmtree(local, ignore_errors=True)
        times.append(r["seconds"])
        cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
        print(f"  restore {i + 1}: {r['seconds']:.2f} s for {r['bytes'] / 1e6:.0f} MB in "
              f"{r['files']} files ({cpu:.1f} s of CPU); over one download of the state "
              f"({r['logical_download_s']:.2f} s) {r['seconds'] / r['logical_download_s']:.2f}x, "
              f"over its own floor ({r['download_floor_s']:.2f} s) "
              f"{r['seconds'] / r['download_floor_s']:.2f}x; load {os.getloadavg()[0]:.1f}",
              flush=True)
    times.sort()
    print(f"median {times[len(times) // 2]:.2f} s, min {times[0]:.2f} s, max {times[-1]:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
