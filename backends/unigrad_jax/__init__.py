"""unigrad's jax backend (being written)."""
