"""Command-line options of ``quotientsharp reproduce vit``, and the sizes they name, without
torch (``reproduce vit --help`` imports this module only)."""

from __future__ import annotations

import argparse

from .family_options import add_family_arguments

__all__ = ["FULL_MODELS", "QUICK_MODELS", "QUICK_N_ITER", "add_arguments"]

#: Models of the full variant, of the ``--quick`` one, and the quick variant's ascent steps.
FULL_MODELS = 32
QUICK_MODELS = 6
QUICK_N_ITER = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce vit``."""
    add_family_arguments(parser, "vit", FULL_MODELS, QUICK_MODELS, QUICK_N_ITER)
