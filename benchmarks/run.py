"""The benchmark suite's runner: every benchmark in one process, ratios printed and optionally saved.

    python benchmarks/run.py [--quick] [--json PATH] [--plot DIR]     (also: unigrad bench [--quick])
    python benchmarks/run.py --only tape,per_example --json PATH        (some sections; the file keeps the rest)
    python benchmarks/run.py --from-json PATH --plot DIR                 (figures from a saved run)

Benchmarks report ratios against a native or peer implementation measured in the same run;
absolute times depend on the machine and are shown only for scale. Each ratio is the median of
per-round ratios; the runner also keeps how far the rounds spread, and says so when a ratio is
too noisy to read (a shared machine, or ``--quick``'s three rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_batched_jacobian  # noqa: E402
import bench_bridge  # noqa: E402
import bench_checkpoint  # noqa: E402
import bench_calls  # noqa: E402
import bench_clients  # noqa: E402
import bench_first_call  # noqa: E402
import bench_per_example  # noqa: E402
import bench_tape  # noqa: E402

try:
    import bench_sparse  # noqa: E402  (needs scipy: the extra unigrad[sparse])
except ImportError:
    bench_sparse = None

import unigrad  # noqa: E402

#: A ratio is too noisy to read when its rounds spread over more than this fraction of the median.
NOISE_LIMIT = 0.10
#: From this many rounds on, the spread is the middle half of the rounds (one spike does not count).
ROBUST_ROUNDS = 8


class Ratio(float):
    """A median ratio that remembers its per-round ratios (it prints and serialises as the float)."""

    per_round: tuple[float, ...] = ()

    @property
    def spread(self) -> tuple[float, float]:
        """``(low, high)``: the interquartile range of the per-round ratios (the whole range with few rounds)."""
        values = sorted(self.per_round)
        if len(values) >= ROBUST_ROUNDS:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
            return q1, q3
        return values[0], values[-1]

    @property
    def noisy(self) -> bool:
        low, high = self.spread
        return len(self.per_round) < 2 or (high - low) > NOISE_LIMIT * abs(float(self))


def ratio_with_rounds(rounds, i, j):
    """The benchmarks' ``ratio`` (median of per-round ratios), keeping the per-round values."""
    per_round = tuple(r[i] / r[j] for r in rounds)
    value = Ratio(statistics.median(per_round))
    value.per_round = per_round
    return value


# The benchmark modules compute every ratio through ``ratio``; the runner hands them the version
# that remembers the rounds, so it can judge noise without the modules knowing.
bench_tape.ratio = ratio_with_rounds
bench_batched_jacobian.ratio = ratio_with_rounds
if bench_sparse is not None:
    bench_sparse.ratio = ratio_with_rounds
bench_calls.ratio = ratio_with_rounds
bench_clients.ratio = ratio_with_rounds
bench_per_example.ratio = ratio_with_rounds


def ratios(results, path=()):
    """``(path, Ratio)`` for every ratio in ``results`` (nested dicts), in order."""
    for key, value in results.items():
        if isinstance(value, Ratio):
            yield (*path, key), value
        elif isinstance(value, dict):
            yield from ratios(value, (*path, key))


def noise_report(results) -> tuple[dict, list[str]]:
    """Per ratio, its median, spread and verdict (for the JSON), and one warning line per noisy ratio."""
    table, warnings = {}, []
    for path, value in ratios(results):
        low, high = value.spread
        name = ".".join(path)
        table[name] = {"median": float(value), "low": low, "high": high, "rounds": len(value.per_round),
                       "noisy": value.noisy}
        if value.noisy:
            n = len(value.per_round)
            which = f"the middle half of its {n} rounds" if n >= ROBUST_ROUNDS else f"its {n} rounds"
            warnings.append(f"  {name} = {float(value):.2f} is too noisy to read: {which} gave {low:.2f}-{high:.2f}")
    return table, warnings


def plot(results, directory) -> list[pathlib.Path]:
    """The docs' figures (PNG) from a run's results: each ratio as a bar, the range its rounds
    spread over as an error bar, the target as a dashed line. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    noise = results.get("noise", {})

    def bars(ax, entries, target, ylabel, log=False):
        labels = [label for label, _ in entries]
        values = [results_at(path) for _, path in entries]
        spread = [noise.get(".".join(path), {}) for _, path in entries]
        low = [v - s.get("low", v) for v, s in zip(values, spread)]
        high = [s.get("high", v) - v for v, s in zip(values, spread)]
        ax.bar(labels, values, color="#3f51b5", yerr=[low, high], capsize=4, ecolor="#555555")
        for k, v in enumerate(values):
            ax.annotate(f"{v:.2f}", (k, v), textcoords="offset points", xytext=(10, 4), fontsize=9)
        if target is not None:
            ax.axhline(target, color="#c62828", linestyle="--", linewidth=1, label=f"target {target}")
            ax.legend(loc="upper left", fontsize=9)
        ax.axhline(1.0, color="#888888", linewidth=0.6)
        ax.set_ylabel(ylabel)
        top = max(max(values) + max(high or [0]), target or 0)
        if log:  # ratios over two orders of magnitude
            ax.set_yscale("log")
            ax.set_ylim(min(v - d for v, d in zip(values, low)) / 2, top * 2)
        else:
            ax.set_ylim(0, top * 1.25)

    def results_at(path):
        value = results
        for key in path:
            value = value[key]
        return float(value)

    written = []
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), gridspec_kw={"width_ratios": [3, 1]})
    bars(left, [("unigrad tape", ("tape", "mlp_ratio_unigrad_vs_hand")),
                ("HIPS autograd", ("tape", "mlp_ratio_autograd_vs_hand"))], 1.10,
         "time / hand-written backprop")
    left.set_title("MLP gradient (784-256-256-10, batch 128, float64)", fontsize=10)
    bars(right, [("unigrad", ("tape", "tiny_ratio_unigrad_vs_autograd"))], 0.5, "time / HIPS autograd")
    right.set_title("tiny vjp", fontsize=10)
    fig.tight_layout()
    written.append(directory / "bench_tape.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    names = list(results.get("batched_jacobian", {}))
    if names:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        bars(ax, [(name, ("batched_jacobian", name, "ratio")) for name in names], 1.1,
             "unigrad time / native time")
        ax.set_title("per-example Jacobians (MLP 32-64-16, batch 256, float32, compiled)", fontsize=10)
        fig.tight_layout()
        written.append(directory / "bench_batched_jacobian.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    per_example = results.get("per_example", {}).get("ratio_vs_torch_func", {})
    if per_example:
        fig, ax = plt.subplots(figsize=(10, 3.8))
        bars(ax, [(name.replace(" ", "\n", 1), ("per_example", "ratio_vs_torch_func", name)) for name in per_example],
             0.2, "time / torch.func vmap(grad)", log=True)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_title("per-example gradient norms (MLP 784-256-10, batch 128, float32)", fontsize=10)
        fig.tight_layout()
        written.append(directory / "bench_per_example.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def _pairs(results):
    return {str(n): r for n, r in bench_bridge.run(results["quick"]).items()}


# The suite's sections in the order they run: (key in the results, heading, what it needs, run, report).
# ``run`` takes the run's state: {"quick": bool, "names": the compiled backends installed}.
SECTIONS = [
    ("tape", "the NumPy tape", (), lambda s: bench_tape.run(s["quick"]), bench_tape.report),
    ("batched_jacobian", "per-example Jacobians (batched_jacobian, compile=True) against native compiled forms",
     (), lambda s: bench_batched_jacobian.run(s["names"], s["quick"]), bench_batched_jacobian.report),
    ("checkpoint", "checkpoint: memory of a gradient through a deep chain of blocks", (),
     lambda s: bench_checkpoint.run(s["quick"]), bench_checkpoint.report),
    ("bridge", "bridge: a torch function inside a JAX transform", ("jax", "torch"), _pairs, bench_bridge.report),
    ("sparse", "sparse Jacobians and Hessians (sparse_jacobian / sparse_hessian) against dense, and asdex on JAX",
     ("scipy",), lambda s: bench_sparse.run(["numpy"] + s["names"], s["quick"]),
     lambda r: bench_sparse.report(r)),
    ("calls", "compiled calls with a new Python float every call (grad, compile=True) against native", (),
     lambda s: bench_calls.run([n for n in ("jax", "tensorflow") if n in s["names"]], s["quick"]),
     bench_calls.report),
    ("torch_calls", "torch: per-call overhead of eager grad and hessian_vector_product against native forms",
     ("torch",), lambda s: bench_calls.run(["torch"], s["quick"], 0 if s["quick"] else 3)["torch"],
     lambda r: bench_calls.report({"torch": r})),
    ("clients", "what real clients pay: transforms built inline and nested, NumPy into compiled JAX (issue 37)", (),
     lambda s: bench_clients.run(s["quick"]), bench_clients.report),
    ("first_call", "the first call of batched_jacobian in a fresh process, against the native first call", (),
     lambda s: bench_first_call.run(s["names"], 2 if s["quick"] else 5), bench_first_call.report),
    ("per_example", "per-example gradient norms against torch.func (and Opacus, BackPACK where installed)",
     ("torch",), lambda s: bench_per_example.run(s["quick"]), bench_per_example.report),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (noisier)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="DIR", help="also draw the figures of docs/performance.md (PNG) into DIR")
    parser.add_argument("--from-json", metavar="PATH", help="do not run: read the results of an earlier --json run")
    parser.add_argument("--only", metavar="SECTIONS",
                        help="run only these sections (comma-separated: " + ", ".join(k for k, *_ in SECTIONS)
                             + "); with --json, an existing file keeps the sections not run")
    args = parser.parse_args(argv)
    if args.from_json:
        results = json.loads(pathlib.Path(args.from_json).read_text())
        for path in plot(results, args.plot or "."):
            print(f"wrote {path}")
        return 0
    known = [k for k, *_ in SECTIONS]
    only = known if not args.only else [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in only if k not in known]
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; the sections are {', '.join(known)}")
    versions = {n: i["version"] for n, i in unigrad.backends().items() if i["available"]}
    have = set(versions) | ({"scipy"} if bench_sparse is not None else set())
    state = {"quick": args.quick, "names": [n for n in ("jax", "torch", "tensorflow") if n in versions]}
    results = {"versions": versions}
    for key, heading, needs, run, report in SECTIONS:
        if key in only and set(needs) <= have:
            print(f"\n== {heading} ==")
            results[key] = run(state)
            report(results[key])
    results["noise"], warnings = noise_report(results)
    if warnings:
        print(f"\nnoisy ratios (their rounds spread by more than {NOISE_LIMIT:.0%} of the median; "
              f"{'run without --quick, ' if args.quick else ''}on a quieter machine):")
        print("\n".join(warnings))
    if args.json:
        saved = _merged(pathlib.Path(args.json), results) if args.only else results
        pathlib.Path(args.json).write_text(json.dumps(saved, indent=2))
        results = saved
    if args.plot:
        for path in plot(results, args.plot):
            print(f"wrote {path}")
    return 0


def _merged(path, results):
    """An earlier run's results (if ``path`` exists) with the sections of this run replacing theirs."""
    if not path.exists():
        return results
    saved = json.loads(path.read_text())
    ran = [k for k in results if k not in ("versions", "noise")]
    noise = {name: v for name, v in saved.get("noise", {}).items() if name.split(".")[0] not in ran}
    saved.update({k: results[k] for k in ran})
    saved["versions"] = results["versions"]
    saved["noise"] = {**noise, **results["noise"]}
    return saved


if __name__ == "__main__":
    sys.exit(main())
