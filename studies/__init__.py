"""Optuna study storage, records and queries (no torch)."""
