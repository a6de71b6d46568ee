"""Helpers shared by several test modules (tests import product code or these, never another
test module)."""
