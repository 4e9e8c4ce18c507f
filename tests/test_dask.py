"""unigrad.dask: per-example transforms over Dask arrays, on a LocalCluster of separate worker processes.

The cluster has two worker processes (one thread each), as a small multi-node cluster would. The tests
prove: results equal the in-memory ones (NumPy tape and torch); parameters are one task of the graph;
each worker builds the in-memory transform once, not once per block; a data set on disk larger than the
workers' memory budget streams through with the measured peak RSS of each worker under its budget; an
error inside f on a worker reaches the caller with its type and message; a killed worker's blocks are
recomputed. And the in-memory API's guard, ``unigrad.dask._reject_lazy``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import unigrad

from conftest import optional, requires, skip_unless

dask, da = optional("dask"), optional("dask.array")
distributed, cloudpickle = optional("distributed"), optional("cloudpickle")
needs_dask = requires("dask", "dask.array", "distributed", "cloudpickle")  # every test but the import check

import unigrad.dask as ud  # noqa: E402 -- imports no dask itself

# The functions below travel to the workers; this module is not importable there (tests/ is not on their path).
if cloudpickle is not None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

N, D, K = 200, 6, 3
RNG = np.random.default_rng(0)
X = RNG.normal(size=(N, D))
Y = RNG.normal(size=(N,))
W = RNG.normal(size=(D, K))


def model(x, w):
    """A batch of examples (B, D) -> (B, K)."""
    xp = unigrad.namespace(x, w)
    return xp.tanh(x @ w)


def loss(w, x, y):
    """The loss of one example (x: (D,), y: ())."""
    xp = unigrad.namespace(w, x)
    return (xp.sum(xp.tanh(x @ w)) - y) ** 2


def features(x, w):
    """One example -> a pytree of outputs."""
    xp = unigrad.namespace(x, w)
    return {"score": xp.sum(x @ w), "hidden": xp.tanh(x @ w)}


def assert_same(got, expected):
    np.testing.assert_allclose(np.asarray(got), unigrad.to_numpy(expected), rtol=1e-13, atol=1e-15)


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                       memory_limit="2GB")
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def _builds(client, token_prefix):
    """{worker: transforms built there for this unigrad.dask transform}."""
    per_worker = client.run(ud._builds_here)
    return {w: sum(n for t, n in b.items() if t.startswith(token_prefix)) for w, b in per_worker.items()}


# ---------------------------------------------------------------------------------------------
# Equal to the in-memory results, on separate worker processes
# ---------------------------------------------------------------------------------------------

@needs_dask
@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_equal_to_in_memory(client, engine):
    backend = engine
    if backend == "torch":
        skip_unless("torch")
    Xd = da.from_array(X, chunks=25)  # 8 blocks over 2 workers
    Yd = da.from_array(Y, chunks=40)  # other chunks: rechunked to X's
    compile = backend == "torch"

    jac = ud.batched_jacobian(model, backend=backend, compile=compile)
    J = jac(Xd, W)
    assert isinstance(J, da.Array) and J.shape == (N, K, D) and J.chunks[0] == (25,) * 8
    pex = ud.per_example_grad(loss, backend=backend, compile=compile)
    G = pex(W, Xd, Yd)
    assert isinstance(G, da.Array) and G.shape == (N, D, K)
    V = ud.vmap(features, backend=backend)(Xd, W)
    assert set(V) == {"score", "hidden"} and V["hidden"].shape == (N, K)

    # torch on one worker: importing and warming it up costs ~10-20 s per process on 2 busy cores
    workers = None if backend == "numpy" else sorted(client.scheduler_info()["workers"])[:1]
    J_, G_, V_ = client.compute([J, G, V], sync=True, workers=workers)
    assert_same(J_, unigrad.batched_jacobian(model, backend=backend)(X, W))
    assert_same(G_, unigrad.vmap(unigrad.grad(loss, backend=backend), in_axes=(None, 0, 0), backend=backend)(W, X, Y))
    expected = unigrad.vmap(features, in_axes=(0, None), backend=backend)(X, W)
    for name in ("score", "hidden"):
        assert_same(V_[name], expected[name])

    # 8 blocks on 2 workers: each worker built each in-memory transform at most once
    for transform in (jac, pex):
        builds = _builds(client, transform.token)
        assert sum(builds.values()) >= 1 and max(builds.values()) == 1, builds
    # the parameters reached each worker once (one spec per call, unpickled once per worker), not once per block
    received = client.run(ud._received_here)
    per_worker = [sum(n for t, n in r.items() if t.startswith(jac.token)) for r in received.values()]
    assert sum(per_worker) >= 1 and max(per_worker) == 1, received
    # the same transform called again (new data, same blocks) builds nothing new
    client.compute(jac(Xd * 2.0, W), sync=True, workers=workers)
    assert max(_builds(client, jac.token).values()) == 1


@needs_dask
def test_parameters_are_one_task():
    """The parameters and f form one task that every block task depends on (sent once per worker)."""
    Xd = da.from_array(X, chunks=25)
    J = ud.batched_jacobian(model)(Xd, W)
    graph = dict(J.__dask_graph__())
    specs = [k for k, v in graph.items() if isinstance(v, ud._Spec)]
    assert len(specs) == 1 and graph[specs[0]].leaves[1] is W
    blocks = [v for v in graph.values() if isinstance(v, tuple) and v[:1] == (ud._run_block,)]
    assert len(blocks) == 8
    for task in blocks:  # each block task names the spec by its key, and holds no array but its block's key
        assert task[1] == specs[0] and not any(isinstance(a, (ud._Spec, np.ndarray)) for a in task)


@needs_dask
def test_batched_argument_pytrees_and_errors():
    Xd = da.from_array(X, chunks=50)
    # a batched in-memory differentiated argument is split like the Dask ones
    J = ud.batched_jacobian(lambda x, z: x * z, argnums=(0, 1))(Xd, X)
    assert isinstance(J, tuple) and len(J) == 2
    got = dask.compute(*J, scheduler="sync")
    expected = unigrad.batched_jacobian(lambda x, z: x * z, argnums=(0, 1))(X, X)
    for g, e in zip(got, expected):
        assert_same(g, e)
    # in_axes given: an in-memory argument marked 0 is split into the Dask argument's blocks, wherever it stands
    V = ud.vmap(lambda y, x: y * x.sum(), in_axes=(0, 0))(Y, Xd)
    assert V.chunks == ((50,) * 4,)
    assert_same(V.compute(scheduler="sync"), unigrad.vmap(lambda y, x: y * x.sum())(Y, X))
    # has_aux: a batched aux comes back as Dask arrays too; one without a batch axis is refused
    J, aux = ud.batched_jacobian(lambda x: (x ** 3, {"square": x ** 2}), has_aux=True)(Xd)
    expected_J, expected_aux = unigrad.batched_jacobian(lambda x: (x ** 3, {"square": x ** 2}), has_aux=True)(X)
    assert_same(J.compute(scheduler="sync"), expected_J)
    assert_same(aux["square"].compute(scheduler="sync"), expected_aux["square"])
    with pytest.raises(ValueError, match="must have the batch on axis 0"):
        ud.batched_jacobian(lambda x: (x ** 3, x.sum()), has_aux=True)(Xd)
    with pytest.raises(ValueError, match="has 100 examples"):
        ud.vmap(lambda a, b: a + b)(Xd, da.from_array(X[:100]))
    with pytest.raises(ValueError, match="no argument is batched"):
        ud.vmap(features)(X, W)
    with pytest.raises(TypeError, match="no batched argument is a Dask array"):
        ud.vmap(features, in_axes=(0, None))(X, W)
    with pytest.raises(ValueError, match="in_axes"):
        ud.vmap(features, in_axes=(1, None))
    with pytest.raises(TypeError, match="not mapped"):
        ud.vmap(features, in_axes=(0, None))(Xd, da.from_array(W))


# ---------------------------------------------------------------------------------------------
# Failures and lost workers
# ---------------------------------------------------------------------------------------------

def flagged(x, flags):
    """Raises on a worker when a block holds a flagged example (the probe's stand-in holds none)."""
    bad = np.flatnonzero(np.asarray(flags))
    if bad.size:
        raise ValueError(f"example flagged at row {int(bad[0])} of its block")
    return x ** 2


@needs_dask
def test_error_on_a_worker_keeps_type_and_message(client):
    flags = np.zeros(N, dtype=np.int64)
    flags[130] = 1
    J = ud.batched_jacobian(flagged)(da.from_array(X, chunks=50), da.from_array(flags, chunks=50))
    with pytest.raises(ValueError, match="example flagged at row 30 of its block"):
        client.compute(J, sync=True)


def _load(block, log, marker, doomed, block_info=None):
    """Read a block (a stand-in for I/O: 0.2 s); the first read of block ``doomed`` kills its worker process."""
    i = block_info[0]["chunk-location"][0]
    with open(log, "a") as fh:
        fh.write(f"{i} {os.getpid()}\n")
    time.sleep(0.2)
    if i == doomed and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    return block


@needs_dask
def test_killed_worker_blocks_are_recomputed(client, tmp_path):
    log, marker, doomed = str(tmp_path / "log"), str(tmp_path / "killed"), 6
    Xd = da.from_array(X, chunks=25).map_blocks(_load, log, marker, doomed, dtype=X.dtype)
    J = ud.batched_jacobian(model)(Xd, W)
    got = client.compute(J, sync=True)
    assert_same(got, unigrad.batched_jacobian(model)(X, W))
    assert os.path.exists(marker)  # the worker was killed
    runs = [tuple(map(int, line.split())) for line in open(log)]
    pids_of = {}
    for i, pid in runs:
        pids_of.setdefault(i, []).append(pid)
    dead = pids_of[doomed][0]
    alive = set(client.run(os.getpid).values())
    assert dead not in alive and len(pids_of[doomed]) >= 2
    # The block whose read killed the worker was read again on a live one. Other blocks read on the dead
    # worker are recomputed only where their results were still needed and held there alone: a result
    # already handed to the next task on another worker is not (the scheduler's rule), so which of them
    # run twice depends on timing, and the right result above is what this test can require of them.
    assert any(p != dead for p in pids_of[doomed]), pids_of



@needs_dask
def test_a_new_python_state_reaches_the_workers(client):
    """A worker keeps the in-memory transform it built from the f it received. An f pickled by value (a
    closure here; any function of a script's __main__) carries the values it reads when it is pickled, and a
    setting changed between calls must reach the workers (the token holds a hash of f's Python state:
    unigrad.dask.WORKERS), not the transform built from the f pickled with the old value. (A function of an
    importable module travels by reference: the workers read their own import of it.)"""
    setting = {"scale": 1.0}

    def scaled(x, w):
        xp = unigrad.namespace(x, w)
        return xp.tanh(x @ w) * setting["scale"]

    J = ud.batched_jacobian(scaled)
    Xd = da.from_array(X, chunks=50)
    for scale in (1.0, 3.0, 1.0):
        setting["scale"] = scale
        assert_same(client.compute(J(Xd, W), sync=True), unigrad.batched_jacobian(scaled)(X, W))

# ---------------------------------------------------------------------------------------------
# Out of core: a data set on disk larger than the workers' memory budget
# ---------------------------------------------------------------------------------------------

def _peak_rss_mb():
    """This process's peak resident set (VmHWM; ru_maxrss would include the pre-exec parent's)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


@needs_dask
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS read from /proc/self/status")
def test_data_larger_than_memory_budget(tmp_path):
    # 520 MB of float64 on disk; 2 workers of 240 MB each (a worker's own imports take 100-180 MB of it,
    # depending on which frameworks the entry points pull in)
    budget, rows, d, k = 240e6, 650_000, 100, 2
    path = tmp_path / "examples.npy"
    data = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(rows, d))
    step = 50_000
    for start in range(0, rows, step):
        data[start:start + step] = np.random.default_rng(start).random((min(step, rows - start), d)) - 0.5
    data.flush()
    del data
    nbytes = rows * d * 8
    assert nbytes > 2 * budget  # larger than the two workers' budgets together

    w = np.random.default_rng(1).normal(size=(d, k)) / np.sqrt(d)
    Xd = ud.from_memmap(path, chunks=5_000)  # 100 blocks of 4 MB; the graph holds the path only
    J = ud.batched_jacobian(model)(Xd, w)  # (rows, k, d): 800 MB of results, never held at once
    sample = [0, 123_457, rows - 1]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  memory_limit=int(budget)) as cluster, distributed.Client(cluster) as c:
        total, rows_ = c.compute([J.sum(axis=0), J[sample]], sync=True)
        peaks = c.run(_peak_rss_mb)  # MiB, from each worker process's start
        print(f"peak RSS per worker (MiB): {sorted(peaks.values())}, budget {budget / 2**20:.0f} MiB, "
              f"data {nbytes / 2**20:.0f} MiB")

    # the oracle, streamed here from the file: sum_b diag(1 - tanh(x_b w)^2) w^T
    x = np.load(path, mmap_mode="r")
    s = sum((1 - np.tanh(x[a:a + step] @ w) ** 2).sum(axis=0) for a in range(0, rows, step))
    np.testing.assert_allclose(total, s[:, None] * w.T, rtol=1e-10)
    assert_same(rows_, unigrad.batched_jacobian(model)(np.asarray(x[sample]), w))
    # each worker's peak resident memory stayed within its budget
    assert len(peaks) == 2 and all(p * 2**20 < budget for p in peaks.values()), (peaks, budget)


# ---------------------------------------------------------------------------------------------
# The in-memory API's guard, and imports
# ---------------------------------------------------------------------------------------------

@needs_dask
def test_reject_lazy():
    Xd = da.from_array(X, chunks=50)
    for args, where in [((Xd, W), "argument 0"), ((W, [1.0, {"x": Xd}]), "argument 1[1]['x']")]:
        with pytest.raises(TypeError) as info:
            ud._reject_lazy(args, "batched_jacobian")
        message = str(info.value)
        assert where in message and "unigrad.dask.batched_jacobian" in message and "(200, 6)" in message
    with pytest.raises(TypeError, match=r"unigrad\.dask\.per_example_grad"):
        ud._reject_lazy((W, Xd), "grad")
    ud._reject_lazy((X, 1.0, None, [W, {"a": X}], "text"), "vmap")  # nothing lazy: no error


@needs_dask
def test_in_memory_transform_refuses_a_dask_array():
    with pytest.raises(TypeError, match=r"unigrad\.dask\.batched_jacobian"):
        unigrad.batched_jacobian(model)(da.from_array(X, chunks=50), W)
    with pytest.raises(TypeError, match=r"unigrad\.dask\.per_example_grad"):
        unigrad.grad(lambda w, x: unigrad.namespace(w).sum(model(x, w)))(W, {"x": da.from_array(X, chunks=50)})
    with pytest.raises(TypeError, match=r"unigrad\.dask\.vmap"):
        unigrad.vmap(model, in_axes=(0, None))(da.from_array(X, chunks=50), W)


def test_imports_are_lazy():
    code = ("import sys, unigrad, unigrad.dask; "
            "assert 'dask' not in sys.modules and 'distributed' not in sys.modules, 'imported dask'; "
            "import unigrad.dask as ud, numpy as np; ud._reject_lazy((np.ones(2),), 'vmap'); "
            "assert 'dask' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy())
    out = subprocess.run([sys.executable, "-c", "import sys, unigrad; print('unigrad.dask' in sys.modules)"],
                         check=True, capture_output=True, text=True, env=os.environ.copy())
    assert out.stdout.strip() == "False"
