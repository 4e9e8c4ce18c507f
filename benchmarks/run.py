"""The benchmark suite's runner: every benchmark in one process, ratios printed and optionally saved.

    python benchmarks/run.py [--quick] [--json PATH]     (also: unigrad bench [--quick])

Benchmarks report ratios against a native or peer implementation measured in the same run;
absolute times depend on the machine and are shown only for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_batched_jacobian  # noqa: E402
import bench_tape  # noqa: E402

import unigrad  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (noisier)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    results = {"versions": {n: i["version"] for n, i in unigrad.backends().items() if i["available"]}}
    print("== the NumPy tape ==")
    results["tape"] = bench_tape.run(args.quick)
    bench_tape.report(results["tape"])
    print("\n== per-example Jacobians (batched_jacobian, compile=True) against native compiled forms ==")
    names = [n for n in ("jax", "torch", "tensorflow") if n in results["versions"]]
    results["batched_jacobian"] = bench_batched_jacobian.run(names, args.quick)
    bench_batched_jacobian.report(results["batched_jacobian"])
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
