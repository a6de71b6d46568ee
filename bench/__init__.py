"""Benchmarks, run by hand: ``python -m bench.<name>``."""
