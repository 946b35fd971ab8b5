"""Hand a study's page data to the results-page renderer of a docs folder.

The studies write data only: their results folder, the headline file
``docs/results/data/<study>.json`` (:mod:`quotientsharp.reproduce.headline`) and the page data
``docs/results/data/pages/<study>.json`` (:func:`write_page`: what the page shows, and what
made it, :mod:`quotientsharp.reproduce.provenance`). The Markdown of ``docs/results/`` is not
in the package: it is made by the renderer beside the docs hooks of a checkout,
``DOCS/_hooks/results_pages/`` (:data:`RENDERER`), which :func:`renderer` loads from the docs
folder given to ``--docs`` by its file path. A docs folder without it (a pip-installed package
pointed at an empty folder) is refused by name, before the study runs
(:func:`check_renderer`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from quotientsharp.reproduce.provenance import Provenance, current_provenance
from quotientsharp.workflows.files import write_json_atomic
from quotientsharp.workflows.taus import sign_convention

#: The renderer's package, relative to the docs folder.
RENDERER = Path("_hooks") / "results_pages"
#: The generated results page (``--docs docs`` rewrites it), and its place on the docs site.
RESULTS_PAGE = "docs/results.md (the Results page of the docs site, mkdocs serve)"
#: Where the page data of a study lives, relative to the docs folder.
PAGE_DATA = Path("results") / "data" / "pages"
#: The page data of the summary section: what made it only (its tables come from the
#: headline files).
SUMMARY = "summary"


def reading_guide(generalisation: str | None) -> str:
    """The sign convention of a study's taus (:func:`~quotientsharp.workflows.taus.
    sign_convention`) and where the results page is.

    Parameters
    ----------
    generalisation
        What the taus rank sharpness against (``"test loss"``); ``None`` for a study without
        taus (the pointer to the results page only).
    """
    page = f"Results of every study, next to the paper's: {RESULTS_PAGE}."
    if generalisation is None:
        return page
    return f"{sign_convention(generalisation)} {page}"


def check_renderer(docs_dir: Path) -> Path:
    """The renderer's ``__init__.py`` in ``docs_dir``; a clear error naming ``--docs`` when
    there is none.

    Raises
    ------
    ValueError
        ``docs_dir/_hooks/results_pages/__init__.py`` does not exist.
    """
    init = Path(docs_dir) / RENDERER / "__init__.py"
    if not init.is_file():
        raise ValueError(
            f"--docs {docs_dir}: no results-page renderer at {init}. The pages are rendered by "
            "docs/_hooks/results_pages/ of a quotientsharp checkout: give --docs that "
            "checkout's docs folder, or leave --docs out to write the results folder only "
            "(its page.json holds the page's data)")
    return init


def renderer(docs_dir: Path) -> ModuleType:
    """The renderer package of ``docs_dir`` (:data:`RENDERER`), imported by its file path.

    Each docs folder's renderer is imported once, under a name of its own, so that two docs
    folders never share modules.

    Raises
    ------
    ValueError
        ``docs_dir`` holds no renderer (:func:`check_renderer`).
    """
    init = check_renderer(docs_dir)
    folder = init.parent.resolve()
    name = "_quotientsharp_results_pages_" + hashlib.sha256(
        str(folder).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, init,
                                                  submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None:
        raise ValueError(f"--docs {docs_dir}: cannot import the renderer at {init}")
    module = importlib.util.module_from_spec(spec)
    # registered before it runs: its modules import each other relative to this name
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def page_document(study: str, page: Mapping[str, Any],
                  provenance: Provenance | None = None, command: str | None = None
                  ) -> dict[str, Any]:
    """The page data of ``study``: ``{"study", "provenance", "page"}``.

    Parameters
    ----------
    study
        The study's name (``quotientsharp reproduce STUDY``).
    page
        What the page shows (JSON values), as the study's renderer reads it.
    provenance
        What made it (default :func:`~quotientsharp.reproduce.provenance.current_provenance`
        of ``command``).
    command
        The command line (default: this process's).
    """
    if not isinstance(study, str) or not study or "/" in study or study.startswith("."):
        raise ValueError(f"study must be a plain name, got {study!r}")
    made = provenance if provenance is not None else current_provenance(command)
    return {"study": study, "provenance": dataclasses.asdict(made), "page": dict(page)}


def page_data_path(docs_dir: Path, study: str) -> Path:
    """``docs_dir/results/data/pages/<study>.json``."""
    return Path(docs_dir) / PAGE_DATA / f"{study}.json"


def write_page(docs_dir: Path, document: Mapping[str, Any]) -> Path:
    """Write the page data ``document`` (:func:`page_document`) into ``docs_dir``, render the
    study's section from it and regenerate ``docs/results.md``; the section's path.

    The summary section is stamped with the same provenance (it is regenerated with every
    section, as its tables read every study's headline file).
    """
    renderer_module = renderer(docs_dir)
    path = page_data_path(docs_dir, document["study"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dict(document))
    _write_summary_provenance(docs_dir, document["provenance"])
    section: Path = renderer_module.render_study(Path(docs_dir), document["study"])
    return section


def _write_summary_provenance(docs_dir: Path, provenance: Mapping[str, Any]) -> None:
    path = page_data_path(docs_dir, SUMMARY)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"study": SUMMARY, "provenance": dict(provenance), "page": {}})


def write_section(docs_dir: Path, study: str, markdown: str, *, command: str | None = None,
                  provenance: Provenance | None = None) -> Path:
    """Write a section given as Markdown (a hand-made section, not a study's page), stamped
    with what made it. No study uses it: every study writes page data (:func:`write_page`).
    """
    made = provenance if provenance is not None else current_provenance(command)
    path: Path = renderer(docs_dir).write_section(Path(docs_dir), study, markdown,
                                                  dataclasses.asdict(made))
    return path


def regenerate_results_page(docs_dir: Path, *, command: str | None = None,
                            provenance: Provenance | None = None) -> Path:
    """Regenerate ``docs_dir/results.md`` (the summary stamped with this run's provenance)."""
    made = provenance if provenance is not None else current_provenance(command)
    module = renderer(docs_dir)
    _write_summary_provenance(docs_dir, dataclasses.asdict(made))
    path: Path = module.regenerate_results_page(Path(docs_dir))
    return path
