"""``quotientsharp reproduce summary``: regenerate the summary section from the headline files.

The summary's tables are rendered from the headline files every study writes
(``docs/results/data/<study>.json``) by the renderer of the docs folder; the results page is
regenerated with every study's ``--docs`` run, and this command regenerates it alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

from quotientsharp.reproduce.config import SummaryConfig, check_config
from quotientsharp.reproduce.headline import NOT_HEADLINES

HELP = "the summary section of the results page, regenerated from docs/results/data/*.json"


def run(config: SummaryConfig) -> int:
    """Run ``quotientsharp reproduce summary`` on ``config.docs``; the exit status.

    Returns
    -------
    int
        0 done; 2 when the docs folder has no renderer, ``docs/results/data/`` holds no
        headline file or a headline the summary refuses, the reason printed to stderr.

    Raises
    ------
    TypeError
        ``config`` is not a :class:`~quotientsharp.reproduce.config.SummaryConfig`.
    """
    check_config(config, SummaryConfig, "summary")
    from quotientsharp.reproduce.results_page import check_renderer, regenerate_results_page

    docs = config.docs if config.docs is not None else Path("docs")
    try:
        # a folder that is not a checkout's docs says so first, not that it lacks data
        check_renderer(docs)
    except ValueError as err:
        print(f"quotientsharp reproduce summary: error: {err}", file=sys.stderr)
        return 2
    if not [path for path in (docs / "results" / "data").glob("*.json")
            if path.stem not in NOT_HEADLINES]:
        print(f"quotientsharp reproduce summary: error: no headline file in "
              f"{docs}/results/data/; run a study with --docs first", file=sys.stderr)
        return 2
    try:
        regenerate_results_page(docs)
    except ValueError as err:
        print(f"quotientsharp reproduce summary: error: {err}", file=sys.stderr)
        return 2
    print(f"summary written to {docs / 'results' / 'summary.md'}")
    return 0
