"""Helpers every entry point shares and no vocabulary owns: command-line conventions
(``common.cli``), atomic file output (``common.files``) and headless plots (``common.plots``).

Imports nothing else of the project, and neither torch nor Ray: every package may use it.
"""
