"""A docs folder for tests: the results-page renderer of this checkout under ``_hooks/``."""

from __future__ import annotations

from pathlib import Path

#: The renderer of this checkout (``docs/_hooks/results_pages``).
RENDERER = Path(__file__).resolve().parents[2] / "docs" / "_hooks" / "results_pages"


def docs_with_renderer(folder: Path) -> Path:
    """``folder`` with ``_hooks/results_pages`` linking to this checkout's renderer, as
    ``quotientsharp reproduce STUDY --docs folder`` needs it; returns ``folder``."""
    target = Path(folder) / "_hooks" / "results_pages"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.symlink_to(RENDERER, target_is_directory=True)
    return Path(folder)
