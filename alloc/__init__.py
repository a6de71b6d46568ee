"""The allocator (no torch): from a data profile and a budget, the plan of heads, widths and
ranks per layer (``plan``, ``settings``, ``extract``), the profile it reads (``profiling``),
the calibration of its constants (``calibrate``), its prior over a search space (``prior``) and
a trained checkpoint's compression (``compression``, a public subpackage).

The public names are those of ``__all__``, listed once in ``__init__.pyi`` and imported from
here: each loads its module on first use (``common.lazy``), so that importing ``alloc`` stays
light (no SciPy, no plotting) and a command's ``--help`` loads only what it names. The commands
are ``python -m alloc.solve``, ``alloc.profile`` and ``alloc.calibrate``; every other module is
private to the package: outside it, import its names from ``alloc`` (tests/test_layering
checks)."""

from common.lazy import public_names

__getattr__, __dir__, __all__ = public_names(__name__, __file__)
