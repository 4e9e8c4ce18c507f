"""What unigrad's pytest plugin and its short-named fixtures share: the backends and devices selected on the
command line, and the checks their fixtures make."""

from __future__ import annotations


def _selected_backends(config):
    """The names of the selected backends: those named, or every installed one (found without importing a
    framework: ``unigrad.backends()``)."""
    wanted = config.getoption("--unigrad-backends")
    if wanted is None or wanted == "all":
        from unigrad import backends as installed

        return [name for name, info in installed().items() if info["available"]]
    return [w.strip() for w in wanted.split(",") if w.strip()]


def _selected_devices(config):
    wanted = config.getoption("--unigrad-devices") or "cpu"
    if wanted == "all":
        return ["cpu", "cuda"]
    return [w.strip() for w in wanted.split(",") if w.strip()]


def _has_device(b, device: str) -> bool:
    """Whether backend ``b`` lists ``device``: "cuda"/"gpu" any GPU, "cuda:1" that one."""
    kind, _, index = str(device).partition(":")
    names = [str(d) for d in b.devices()]
    if kind == "cpu":
        return True
    if kind in ("cuda", "gpu"):
        gpus = [d for d in names if d.split(":")[0] in ("cuda", "gpu")]
        return bool(gpus) if not index else any(d.partition(":")[2] == index for d in gpus)
    return str(device) in names


def _explicit(config) -> bool:
    """Whether the backends were named on the command line (not ``all`` installed)."""
    return config.getoption("--unigrad-backends") not in (None, "all")


def _load_failure(name, exc) -> str:
    return (f"backend {name!r} was asked for with --unigrad-backends but does not load: {type(exc).__name__}: {exc}. "
            f"Check the name (`unigrad info` lists the installed backends) and that its package imports.")
