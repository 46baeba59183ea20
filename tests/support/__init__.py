"""Code the tests share (and a benchmark or two): never imported by ``verde_chain``."""
