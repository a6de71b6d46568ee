"""A trained checkpoint measured and compressed: what its attention uses, what a
cut costs the loss, and the students built from a plan
(``python -m workers.compress``)."""
