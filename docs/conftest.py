"""Every ```python block of the documentation pages runs in the test suite (Sybil).

`python -m pytest` collects each page ``docs/*.md`` (``testpaths`` in pyproject.toml) and
each of its python blocks as a test, named by its line. The blocks of one page share one
namespace and run in order, in a temporary working directory, with ``HF_HUB_OFFLINE=1``. A
block that cannot run offline is preceded by Sybil's skip marker, with a reason::

    <!-- skip: next "downloads a checkpoint" -->

``tests/test_docs_examples.py`` checks that the pages written with runnable code keep most of
their blocks tested. Pages below docs/ (dev/, api/, results/) are not collected.

Output blocks. What a python block prints is captured; an ```output block right after it is
the printed text as the page shows it, and is a test of its own: it passes when the text
matches what the block printed in this run (:func:`outputs_match`). So the outputs on the site
are the ones the code produces.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from sybil import Example, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

#: a number as printed: 0.05, -3, 1.2e-16, 2.000e+00
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
#: numbers that agree to this relative tolerance match (the last printed digit may differ
#: between machines)
RELATIVE = 2e-2
#: numbers both below this in size are rounding noise (errors of 1e-16 against 3e-16) and match
ROUNDING = 1e-9


def _numbers_match(expected: str, actual: str) -> bool:
    if re.fullmatch(r"[-+]?\d+", expected):       # counts (steps, iterations) are exact
        return expected == actual
    a, b = float(expected), float(actual)
    if abs(a) <= ROUNDING and abs(b) <= ROUNDING:
        return True
    return math.isclose(a, b, rel_tol=RELATIVE, abs_tol=0.0)


def _line_matches(expected: str, actual: str) -> bool:
    # the text between numbers must be equal; each number must match its counterpart
    if NUMBER.split(expected) != NUMBER.split(actual):
        return False
    return all(_numbers_match(e, a) for e, a in
               zip(NUMBER.findall(expected), NUMBER.findall(actual), strict=True))


def outputs_match(expected: str, actual: str) -> bool:
    """Whether printed text ``actual`` matches an output block ``expected``.

    Lines are compared after stripping trailing spaces, in order. The words and the integers
    must be equal, other numbers equal to 2 % relative, or both below 1e-9 in size (rounding
    noise). A line ``...``
    in ``expected`` stands for any number of lines.
    """
    want = [line.rstrip() for line in expected.strip("\n").splitlines()]
    got = [line.rstrip() for line in actual.strip("\n").splitlines()]

    def match(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i] == "...":
            return any(match(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and _line_matches(want[i], got[j]) and match(i + 1, j + 1)

    return match(0, 0)


class _Tee(io.StringIO):
    """Collects what is printed and passes it on, so that pytest still shows it."""

    def __init__(self, stream: io.TextIOBase) -> None:
        super().__init__()
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(text)
        return super().write(text)


class CapturingEvaluator(PythonEvaluator):
    """Sybil's python evaluator, keeping what the block printed for the next output block."""

    def __call__(self, example: Example) -> None:
        __tracebackhide__ = True
        tee = _Tee(sys.stdout)
        with contextlib.redirect_stdout(tee):
            super().__call__(example)
        example.namespace["_docs_output"] = tee.getvalue()


def check_output(example: Example) -> str | None:
    """An output block: the text the preceding python block printed, or a failure saying how."""
    printed = example.namespace.get("_docs_output")
    if printed is None:
        return "an output block must follow a python block that ran"
    expected = str(example.parsed)
    if outputs_match(expected, printed):
        return None
    return f"the page shows:\n{expected}\nbut the block printed:\n{printed}"


class _PythonParser(PythonCodeBlockParser):
    """Sybil's python parser with :class:`CapturingEvaluator` for its code blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.codeblock_parser = CodeBlockParser("python", CapturingEvaluator())


PARSERS = [_PythonParser(), CodeBlockParser(language="output", evaluator=check_output),
           SkipParser()]


def _setup(namespace: dict) -> None:
    namespace["__name__"] = "docs_page"
    namespace["_docs_state"] = (os.getcwd(), os.environ.get("HF_HUB_OFFLINE"))
    directory = tempfile.mkdtemp(prefix="quotientsharp-docs-")
    namespace["_docs_directory"] = directory
    os.chdir(directory)
    os.environ["HF_HUB_OFFLINE"] = "1"


def _teardown(namespace: dict) -> None:
    cwd, offline = namespace.pop("_docs_state")
    os.chdir(cwd)
    if offline is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = offline
    shutil.rmtree(Path(namespace.pop("_docs_directory")), ignore_errors=True)


pytest_collect_file = Sybil(parsers=PARSERS, patterns=["*.md"], excludes=["*/*.md"],
                            setup=_setup, teardown=_teardown).pytest()
