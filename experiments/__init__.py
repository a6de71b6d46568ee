"""Experiments that reproduce the papers' findings with the product."""
