"""A published model in three frameworks, compared in values and gradients as a new user would: Hugging Face's
GPT-2 (``GPT2Model``, ``FlaxGPT2Model``, ``TFGPT2Model``), a tiny config, random weights made by PyTorch and
converted by transformers' own utilities (``from_pretrained(..., from_pt=True)``). Not part of the test suite:
it needs ``transformers`` 4.x (5.x dropped the Flax and TensorFlow models), ``flax`` and ``tf-keras``, which
unigrad does not depend on. In a separate virtual environment over the project's one:

    python3 -m venv /tmp/hubvenv
    echo "import site; site.addsitedir('$PWD/.venv/lib/python3.11/site-packages')" \
        > /tmp/hubvenv/lib/python3.11/site-packages/zz_project.pth
    /tmp/hubvenv/bin/pip install -c constraints.txt "transformers==4.57.6" flax tf-keras
    TF_CPP_MIN_LOG_LEVEL=2 /tmp/hubvenv/bin/python benchmarks/try_model_hub.py

No network beyond the package index: the weights come from the config (random initialisation), not the hub.

The glue -- everything between the ``glue`` markers -- is the layout mapping and the calls: PyTorch's
parameters (names and layouts) are the canonical inputs; the Flax port maps them with transformers' own
``convert_pytorch_state_dict_to_flax`` (differentiable: it transposes JAX arrays as they come), the
TensorFlow port with its own name mapping and ``apply_transpose``, putting each tensor where the Keras layer
keeps the variable (Keras layers read their weights from attributes; a tensor there is differentiable).
The script prints the report, the number of glue lines, and a second report where the Flax port was built
with ``activation_function="gelu"`` (the exact GELU; GPT-2's is the tanh form): a porting bug to find.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402
from transformers import FlaxGPT2Model, GPT2Config, GPT2Model, TFGPT2Model  # noqa: E402
from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax  # noqa: E402
from transformers.modeling_tf_pytorch_utils import (apply_transpose,  # noqa: E402
                                                    convert_tf_weight_name_to_pt_weight_name)

from unigrad.testing import compare_implementations  # noqa: E402

# "eager" attention: PyTorch's fused CPU attention has no forward mode (the JVP)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
torch.manual_seed(0)
pt = GPT2Model(config).eval()
with tempfile.TemporaryDirectory() as d:
    pt.save_pretrained(d)
    # dtype=None: the Flax modules compute in their inputs' dtype (with the default, float32, unigrad's float64
    # run of the port is float32 too: no rounding estimate, and a 1e-4 tolerance that hides the GELU below)
    fx = FlaxGPT2Model.from_pretrained(d, from_pt=True, dtype=None)
    fx_exact_gelu = FlaxGPT2Model.from_pretrained(d, from_pt=True, dtype=None, activation_function="gelu")
    tfm = TFGPT2Model.from_pretrained(d, from_pt=True)
params = {k: v.detach().numpy() for k, v in pt.named_parameters()}   # the canonical inputs: PyTorch's
ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, 8))


# --- glue: begin
def torch_gpt2(p, ids):
    return torch.func.functional_call(pt, p, (ids,)).last_hidden_state


def flax_gpt2(p, ids, fx=fx):
    return fx(ids, params=convert_pytorch_state_dict_to_flax(dict(p), fx)).last_hidden_state


owners = {id(v): (layer, a) for layer in tfm.submodules for a, v in vars(layer).items() if isinstance(v, tf.Variable)}


def tf_gpt2(p, ids):
    for v in tfm.weights:
        name, t = convert_tf_weight_name_to_pt_weight_name(v.name, "transformer.", tf_weight_shape=v.shape)
        object.__setattr__(*owners[id(v)], apply_transpose(t, tf.convert_to_tensor(p[name]), v.shape))
    return tfm(tf.convert_to_tensor(ids)).last_hidden_state


report = compare_implementations({"torch": torch_gpt2, "jax": flax_gpt2, "tensorflow": tf_gpt2}, (params, ids))
# --- glue: end


def glue_lines() -> int:
    source = Path(__file__).read_text().splitlines()
    begin, end = (next(i for i, line in enumerate(source) if line == f"# --- glue: {w}") for w in ("begin", "end"))
    return sum(1 for line in source[begin + 1:end] if line.strip())


if __name__ == "__main__":
    print(report)
    print(f"\nglue: {glue_lines()} lines (non-blank, between the markers)\n")
    buggy = compare_implementations({"torch": torch_gpt2, "jax": lambda p, ids: flax_gpt2(p, ids, fx_exact_gelu),
                                     "tensorflow": tf_gpt2}, (params, ids))
    print("Flax port built with the exact GELU:", buggy.verdict)
    print(buggy.summary)
    sys.exit(0 if report.ok and not buggy.ok else 1)
