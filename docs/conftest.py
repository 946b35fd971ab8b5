"""Every ```python block of the documentation pages runs in the test suite (Sybil).

`python -m pytest` collects each page ``docs/*.md`` (``testpaths`` in pyproject.toml) and
each of its python blocks as a test, named by its line. The blocks of one page share one
namespace and run in order, in a temporary working directory, with ``HF_HUB_OFFLINE=1``. A
block that cannot run offline is preceded by Sybil's skip marker, with a reason::

    <!-- skip: next "downloads a checkpoint" -->

``tests/test_docs_examples.py`` checks that the pages written with runnable code keep most of
their blocks tested. Pages below docs/ (dev/, api/, results/) are not collected.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

PARSERS = [PythonCodeBlockParser(), SkipParser()]


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
