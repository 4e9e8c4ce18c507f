"""unigrad's torch backend (being written)."""
