"""Helpers shared by test modules (a test module imports product code and these, never
another test module)."""
