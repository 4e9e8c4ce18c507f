"""unigrad's tensorflow backend (being written)."""
