"""The model an ``ArchConfig`` describes: attention kinds, latent attention,
``build_model``."""
