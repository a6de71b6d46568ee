"""Test-only hooks in a search's trials (``sitecustomize.py`` here says what they do)."""

from tests.helpers.trial_hooks.sitecustomize import FAULTS_ENV, PIDS_ENV, hooked_env

__all__ = ["FAULTS_ENV", "PIDS_ENV", "hooked_env"]
