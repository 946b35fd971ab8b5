"""``quotientsharp reproduce summary``: regenerate the summary section from the headline files
(``docs/results/data/<study>.json``) that every study's ``--docs`` run writes."""

from __future__ import annotations

import sys
from pathlib import Path

from quotientsharp.reproduce.config import SummaryConfig, check_config
from quotientsharp.reproduce.headline import NOT_HEADLINES

HELP = "the summary section of the results page, regenerated from docs/results/data/*.json"


def run(config: SummaryConfig) -> int:
    """Run ``quotientsharp reproduce summary`` on ``config.docs`` (a ``TypeError`` unless a
    :class:`~quotientsharp.reproduce.config.SummaryConfig`); 0, or 2 with the reason on stderr
    (no renderer, no headline file, a headline the summary refuses)."""
    check_config(config, SummaryConfig, "summary")
    from quotientsharp.reproduce.results_page import check_renderer, regenerate_results_page

    docs = config.docs if config.docs is not None else Path("docs")
    try:
        # a folder that is not a checkout's docs says so first, not that it lacks data
        check_renderer(docs)
        if not [path for path in (docs / "results" / "data").glob("*.json")
                if path.stem not in NOT_HEADLINES]:
            raise ValueError(f"no headline file in {docs}/results/data/; run a study with "
                             "--docs first")
        regenerate_results_page(docs)
    except ValueError as err:
        print(f"quotientsharp reproduce summary: error: {err}", file=sys.stderr)
        return 2
    print(f"summary written to {docs / 'results' / 'summary.md'}")
    return 0
