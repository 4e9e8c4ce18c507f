"""What the per-example transforms share: the names of the ways a parameter's rows are computed
(shown in ``.paths``) and the check of the per-example losses."""

from __future__ import annotations

MATERIALISED = "materialised"
DENSE_OUTER = "dense: |x|^2 |g|^2"
DENSE_GHOST = "dense: ghost (X X^T) * (G G^T)"
DENSE = "dense: X^T G"
BIAS = "bias: G summed"
SCALE = "scale: G * Z summed"
CONV = "conv: weight gradient, the examples as groups"
CONV_GHOST = "conv: ghost (U U^T) * (G G^T)"
EMBEDDING = "embedding: G added into the looked-up rows"
EMBEDDING_GHOST = "embedding: ghost [idx = idx'] * (G G^T)"
NORM = "norm: xhat * G summed"
SHARED = "shared: uses stacked along positions"
SHARED_SUMMED = "shared: each use's rows summed"


def check_losses(b, outs, batch, fname):
    if len(outs) != 1 or b.shape(outs[0]) != (batch,):
        got = ", ".join(f"shape {b.shape(o)}" for o in outs) if len(outs) != 1 else f"shape {b.shape(outs[0])}"
        hint = (" (a loss summed or averaged over the batch cannot be split into examples by its value: "
                "return the per-example losses, without the final sum or mean)") if (
            len(outs) == 1 and b.shape(outs[0]) == ()) else ""
        raise ValueError(f"{fname}: f must return one loss per example, an array of shape ({batch},); got "
                         f"{got}{hint}")
    if b.dtype(outs[0]) not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"{fname}: f must return real floating losses; got dtype {b.dtype(outs[0])}")
