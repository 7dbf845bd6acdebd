"""Passes over the attention IR, one small named pass per module."""

from attncc.passes.pipeline import PASS_NAMES, default_passes, run_passes

__all__ = ["PASS_NAMES", "default_passes", "run_passes"]
