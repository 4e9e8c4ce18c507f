"""The GPU check: one command, a few minutes, on a machine with CUDA.

    python benchmarks/gpu_check.py            # exit 0 when everything passes

1. Runs the conformance suite (unigrad.testing.conformance) for every backend that sees a CUDA
   device, with inputs placed on it (UNIGRAD_DEVICE=cuda).
2. Compares, on the shipped examples, each GPU backend's value, gradient and per-example
   Jacobian with the NumPy tape on the CPU.
TF32 is disabled (NVIDIA_TF32_OVERRIDE=0 for cuBLAS/cuDNN, JAX's matmul precision "highest"),
so float32 results stay comparable with the CPU. Prints a summary table.
Without a GPU it says so and exits 0 (nothing to check).
"""

from __future__ import annotations

import os

os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT / "examples"))

import unigrad  # noqa: E402


def gpu_backends():
    found = {}
    for name in ("torch", "jax", "tensorflow"):
        try:
            devices = unigrad.get_backend(name).devices()
        except Exception as exc:  # not installed here: reported, not fatal
            print(f"  {name}: unavailable ({type(exc).__name__}: {exc})")
            continue
        gpus = [d for d in devices if d.split(":")[0] in ("cuda", "gpu")]
        print(f"  {name}: devices {list(devices)}")
        if gpus:
            found[name] = gpus
    return found


def run_conformance(names):
    env = {**os.environ, "UNIGRAD_DEVICE": "cuda",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "backends"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "unigrad.testing._pytest_plugin",
           str(ROOT / "unigrad" / "testing" / "conformance.py"), f"--unigrad-backends={','.join(names)}"]
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    tail = [ln for ln in done.stdout.splitlines() if ln.strip()][-15:]
    return done.returncode, time.perf_counter() - start, tail


def compare_examples(names):
    import mlp_loss
    import per_example_jacobian as pej

    rows = []
    params, x, y = mlp_loss.loss_inputs()
    ref_value, ref_grad = unigrad.value_and_grad(mlp_loss.loss, argnums=1, backend="numpy")(params, x, y)
    xb, wb = pej.features_inputs()
    ref_jac = unigrad.batched_jacobian(pej.features, backend="numpy")(xb, wb)
    for name in names:
        for dtype, tol in (("float64", 1e-10), ("float32", 1e-4)):
            cast = lambda a, dt=dtype: np.asarray(a, dtype=dt)  # noqa: E731
            with unigrad.use_device("cuda"):
                value, grad = unigrad.value_and_grad(mlp_loss.loss, argnums=1, backend=name)(
                    {k: cast(v) for k, v in params.items()}, cast(x), cast(y))
                jac = unigrad.batched_jacobian(pej.features, backend=name)(cast(xb), cast(wb))
            errors = {
                "value": _rel(value, ref_value), "grad": _rel(grad, ref_grad), "batched_jacobian": _rel(jac, ref_jac),
            }
            on_gpu = "cuda" in str(unigrad.get_backend(name).device(grad)).lower() or "gpu" in str(
                unigrad.get_backend(name).device(grad)).lower()
            rows.append((name, dtype, errors, on_gpu, all(e <= tol for e in errors.values()) and on_gpu))
    return rows


def _rel(a, b):
    a, b = np.asarray(unigrad.to_numpy(a), np.float64), np.asarray(unigrad.to_numpy(b), np.float64)
    return float(np.max(np.abs(a - b)) / max(1e-300, float(np.max(np.abs(b)))))


def main():
    print("unigrad GPU check")
    found = gpu_backends()
    if not found:
        print("no backend sees a CUDA device: nothing to check here")
        return 0
    names = sorted(found)
    code, seconds, tail = run_conformance(names)
    print(f"\nconformance suite on {names} with UNIGRAD_DEVICE=cuda ({seconds:.0f} s): "
          f"{'PASS' if code == 0 else 'FAIL'}")
    print("\n".join("  " + ln for ln in tail))
    rows = compare_examples(names)
    print("\nexamples on the GPU against the NumPy tape on the CPU (max relative error)")
    print(f"  {'backend':11s} {'dtype':8s} {'value':>10s} {'grad':>10s} {'per-example J':>14s}  on GPU  verdict")
    for name, dtype, e, on_gpu, ok in rows:
        print(f"  {name:11s} {dtype:8s} {e['value']:10.2e} {e['grad']:10.2e} {e['batched_jacobian']:14.2e}  "
              f"{'yes' if on_gpu else 'NO':6s}  {'ok' if ok else 'FAIL'}")
    failed = code != 0 or not all(r[-1] for r in rows)
    print("\nGPU check:", "FAILED" if failed else "passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
