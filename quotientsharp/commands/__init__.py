"""Subcommands of the ``quotientsharp`` console script, one module each.

Every module listed in :data:`COMMANDS` exposes ``add_parser(subparsers)`` and ``run(args) -> int``
and imports its heavy dependencies (torch above all) inside ``run``, so ``quotientsharp --help``
and every subcommand's ``--help`` stay fast (``tests/test_bad_inputs.py`` checks that they do
not import torch). Help texts taken from docstrings go through :func:`plain_text`.
"""

from __future__ import annotations

import re

COMMANDS = {
    "verify": "quotientsharp.commands.verify",
    "symmetries": "quotientsharp.models.cli",
    "measure": "quotientsharp.commands.measure",
    "reproduce": "quotientsharp.commands.reproduce",
    "study": "quotientsharp.commands.study",
}

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def _role_text(match: re.Match[str]) -> str:
    text = match.group(1)
    titled = re.fullmatch(r"(.+?)\s*<[^>]+>", text, re.DOTALL)
    if titled:
        return titled.group(1)
    return text[1:].rsplit(".", 1)[-1] if text.startswith("~") else text


def plain_text(text: str | None) -> str | None:
    """A docstring as terminal help: RST roles (``:func:`~a.b```) and double backticks
    stripped to their text."""
    if text is None:
        return None
    return _LITERAL.sub(r"\1", _ROLE.sub(_role_text, text))


__all__ = ["COMMANDS", "plain_text"]
