"""The sparse transforms' results on torch (``Backend.sparse_matrix``, ``dense_matrix``, ``sparse_to_numpy``):
sparse CSR (``"auto"``, ``"csr"``), CSC and COO tensors, and a dense matrix by ``index_put``."""

from __future__ import annotations

import warnings

import torch


def sparse_matrix(values, s, format, fname):
    with warnings.catch_warnings():  # torch warns that sparse CSR/CSC support is "in beta" on every construction
        warnings.filterwarnings("ignore", message="Sparse (CSR|CSC) tensor support is in beta", category=UserWarning)
        return _layout(values, s, format, fname)


def _layout(values, s, format, fname):
    device = values.device

    def on_device(name):  # the index arrays, moved to the device once per plan (a new tensor each call:
        # torch's sparse tensors share their index tensors, and a user may modify one in place)
        return s.converted(("torch", name, str(device)),
                           lambda: torch.as_tensor(getattr(s, name), device=device)).clone()

    if format in ("auto", "csr"):
        return torch.sparse_csr_tensor(on_device("indptr"), on_device("indices"), values, s.shape)
    if format == "csc":
        return torch.sparse_csc_tensor(on_device("csc_indptr"), on_device("csc_indices"),
                                       values[on_device("csc_order")], s.shape)
    if format == "coo":
        return torch.sparse_coo_tensor(on_device("pairs_t"), values, s.shape, is_coalesced=True)
    raise ValueError(f"{fname}: format={format!r} is not available on torch; use 'csr', 'csc', 'coo', 'dense' "
                     f"or 'scipy'")


def dense_matrix(values, s):
    out = torch.zeros(s.shape[0] * s.shape[1], dtype=values.dtype, device=values.device)
    out = out.index_put((torch.as_tensor(s.flat, device=values.device),), values)
    return out.reshape(s.shape)


def sparse_to_numpy(matrix):
    if matrix.layout != torch.strided:
        matrix = matrix.to_dense()
    return matrix.detach().cpu().numpy()
