"""Hand a study's page data to the results-page renderer of a docs folder,
``DOCS/_hooks/results_pages/`` (:data:`RENDERER`); a docs folder without it is refused before
the study runs."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from quotientsharp.reproduce.provenance import current_provenance
from quotientsharp.workflows.files import write_json_atomic
from quotientsharp.workflows.taus import sign_convention

#: The renderer's package, relative to the docs folder.
RENDERER = Path("_hooks") / "results_pages"


def reading_guide(generalisation: str | None) -> str:
    """The sign convention of a study's taus against ``generalisation`` (``"test loss"``;
    ``None``: a study without taus) and where the results page is."""
    page = ("Results of every study, next to the paper's: docs/results.md (the Results page of "
            "the docs site, mkdocs serve).")
    if generalisation is None:
        return page
    return f"{sign_convention(generalisation)} {page}"


def check_renderer(docs_dir: Path) -> Path:
    """The renderer's ``__init__.py`` in ``docs_dir``; ``ValueError`` naming ``--docs`` when
    there is none."""
    init = Path(docs_dir) / RENDERER / "__init__.py"
    if not init.is_file():
        raise ValueError(
            f"--docs {docs_dir}: no results-page renderer at {init}. The pages are rendered by "
            "docs/_hooks/results_pages/ of a quotientsharp checkout: give --docs that "
            "checkout's docs folder, or leave --docs out to write the results folder only "
            "(its page.json holds the page's data)")
    return init


def renderer(docs_dir: Path) -> ModuleType:
    """The renderer package of ``docs_dir``, imported once by its file path under a name of
    its own (two docs folders never share modules); ``ValueError`` when there is none."""
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


def page_document(study: str, page: Mapping[str, Any]) -> dict[str, Any]:
    """The page data of ``study``, ``{"study", "provenance", "page"}``: what the page shows
    (JSON values, as the study's renderer reads them) and what made it (this process)."""
    if not isinstance(study, str) or not study or "/" in study or study.startswith("."):
        raise ValueError(f"study must be a plain name, got {study!r}")
    return {"study": study, "provenance": dataclasses.asdict(current_provenance()),
            "page": dict(page)}


def page_data_path(docs_dir: Path, study: str) -> Path:
    """``docs_dir/results/data/pages/<study>.json``."""
    return Path(docs_dir) / "results" / "data" / "pages" / f"{study}.json"


def write_page(docs_dir: Path, document: Mapping[str, Any]) -> Path:
    """Write the page data ``document`` into ``docs_dir``, render the study's section and
    regenerate ``docs/results.md``; the section's path."""
    renderer_module = renderer(docs_dir)
    path = page_data_path(docs_dir, document["study"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dict(document))
    _write_summary_provenance(docs_dir, document["provenance"])
    section: Path = renderer_module.render_study(Path(docs_dir), document["study"])
    return section


def _write_summary_provenance(docs_dir: Path, provenance: Mapping[str, Any]) -> None:
    """Stamp the summary section's page data (its tables come from the headline files)."""
    path = page_data_path(docs_dir, "summary")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"study": "summary", "provenance": dict(provenance), "page": {}})


def regenerate_results_page(docs_dir: Path) -> Path:
    """Regenerate ``docs_dir/results.md`` (the summary stamped with this run's provenance)."""
    module = renderer(docs_dir)
    _write_summary_provenance(docs_dir, dataclasses.asdict(current_provenance()))
    path: Path = module.regenerate_results_page(Path(docs_dir))
    return path
