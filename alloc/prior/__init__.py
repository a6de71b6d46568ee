"""The allocator as a search prior: the bound's density over a space's points
(``bound``) and the Optuna sampler that follows it as far as the evidence agrees
(``sampler``)."""
