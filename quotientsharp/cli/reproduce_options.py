"""The options of every ``quotientsharp reproduce STUDY`` (:data:`STUDY_OPTIONS`) and the
configuration they make (:func:`study_config`), without torch: ``--help`` imports no study."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from functools import partial
from pathlib import Path

from quotientsharp.reproduce.config import (
    DiagonalConfig,
    FamilyConfig,
    InvarianceConfig,
    ReachConfig,
    ReproduceConfig,
    SummaryConfig,
)
from quotientsharp.reproduce.families.sizes import (
    BERT_SIZES,
    LORA_SIZES,
    MINILM_SIZES,
    VIT_FINETUNE_SIZES,
    VIT_SIZES,
    FamilySizes,
)
from quotientsharp.workflows.options import InputError


def add_common_options(parser: argparse.ArgumentParser, name: str, units: str,
                       out_note: str = "", docs_note: str = "") -> None:
    """``--out``, ``--resume``, ``--no-plots``, ``--progress``, ``--docs`` and ``--threads`` of
    study ``name`` (its results folder and docs page), whose folder holds ``units`` (in words,
    ``"nets"``); ``out_note`` and ``docs_note`` end the help of ``--out`` and ``--docs``.
    Paths are read as text, made paths by the configuration: ``Path("")`` would be the working
    directory, and an empty path must be refused as such."""
    parser.add_argument("--out", type=str, default=None,
                        help=f"results folder (default results/{name}, or "
                             f"results/{name}-quick with --quick){out_note}")
    parser.add_argument("--resume", action="store_true",
                        help=f"keep the {units} already in the results folder and compute only "
                             "the missing ones (the settings must match)")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="do not write the figures")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show progress bars (default: on a terminal)")
    parser.add_argument("--docs", type=str, default=None, metavar="DIR",
                        help=f"also write the page's data under DIR/results/data/, render "
                             f"DIR/results/{name}.md{docs_note} from it and regenerate "
                             "DIR/results.md (DIR: the docs folder of a checkout, whose "
                             "_hooks/results_pages renders the pages)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads during the run (default 1: fastest for these "
                             "small tensors)")


def add_diagonal_options(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce diagonal``."""
    add_common_options(parser, "diagonal", "nets")
    parser.add_argument("--quick", action="store_true",
                        help="reduced run: 12 nets, 10 ascent steps, 2000 test inputs")
    parser.add_argument("--full", action="store_true",
                        help="also run 3 data seeds, the rho sweep 0.03, 0.1, 0.3 and a "
                        "training set per net, each in OUT/full/<run>/, and write the pooled "
                        "tables (about 10 to 20 minutes on one core)")
    parser.add_argument("--rhos", default=None, metavar="LIST",
                        help="with --full: the radii of the rho sweep, comma-separated "
                             "(default 0.03,0.1,0.3; must contain the study's 0.1); fewer "
                             "radii make a shorter run")
    parser.add_argument("--per-net-seeds", type=int, default=None, metavar="N",
                        help="with --full: run the training-set-per-net variant on the first "
                             "N seeds only (default all 3; 0 for none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    parser.add_argument("--nets", type=int, default=None,
                        help="number of nets (default 50, or 12 with --quick)")


def _add_family_options(parser: argparse.ArgumentParser, name: str,
                        sizes: FamilySizes) -> None:
    """Command-line options of a family study (the conventions of ``reproduce diagonal``)."""
    add_common_options(parser, name, "models")
    parser.add_argument("--quick", action="store_true",
                        help=f"reduced run ({sizes.quick_models} models, tiny training, "
                             f"{sizes.quick_n_iter} ascent steps): a smoke test, not a result")
    parser.add_argument("--seed", type=int, default=0,
                        help="study seed: hyperparameters and initialisation of model i are "
                             "drawn from (seed, i) (default 0)")
    parser.add_argument("--study-seeds", type=int, default=None, metavar="S",
                        help="replicate over S study seeds (--seed, --seed + 1, ...): each "
                             "draws new hyperparameters, initialisations and training-pool "
                             "order for its --models models; the page gives per-seed taus, "
                             "taus pooled over the seeds with a cluster bootstrap interval, "
                             "and Holm-corrected paired differences (default: one seed, the "
                             "single-seed study)")
    parser.add_argument("--models", type=int, default=None,
                        help=f"number of models, at least 2 (default {sizes.full_models}, or "
                             f"{sizes.quick_models} with --quick)")
    parser.add_argument("--device", default="cpu",
                        help="torch device of training and measuring, e.g. cuda (default cpu)")
    parser.add_argument("--n-iter", type=int, default=None,
                        help=f"Auto-PGD steps per batch (default {sizes.full_n_iter}, or "
                             f"{sizes.quick_n_iter} with --quick)")
    parser.add_argument("--sharpness-points", type=int, default=None,
                        help=f"training points the sharpness is measured on (default "
                             f"{sizes.full_sharpness_points})")
    parser.add_argument("--sharpness-batch-size", type=int, default=None,
                        help=f"batch of the sharpness measurement (default "
                             f"{sizes.full_sharpness_batch_size})")


def add_invariance_options(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce invariance``."""
    # torch-free: the study module imports torch only inside its functions
    from quotientsharp.reproduce.invariance.study import DTYPES, MEASURES, QUICK

    add_common_options(parser, "invariance", "grid points",
                       out_note="; one subfolder per precision",
                       docs_note=" (and its figure in DIR/results/figures/invariance/)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), metavar="LIST",
                        help="model precisions, comma-separated, from "
                             f"{', '.join(DTYPES)} (default all three): weights and forward "
                             "in that precision; the geometry runs in float64 for float64 "
                             "models and in float32 otherwise")
    parser.add_argument("--quick", action="store_true",
                        help=f"reduced run ({len(QUICK.grid)} grid points, "
                             f"{QUICK.sentences} sentences, {QUICK.n_iter} ascent steps, "
                             f"{len(QUICK.measures)} measures)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the head, the sentences and the matrices N (default 0)")
    parser.add_argument("--measures", default=None, metavar="LIST",
                        help="measures to run, comma-separated, from "
                             f"{', '.join(key for key, _, _ in MEASURES)} (default: all six, "
                             "or the quick variant's three with --quick); a reduced run of "
                             "the full grid")


def add_reach_options(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce reach``."""
    parser.add_argument("--out", type=str, default=None,
                        help="results folder (default results/reach, or results/reach-quick "
                             "with --quick)")
    parser.add_argument("--docs", type=str, default=None, metavar="DIR",
                        help="also write DIR/results/reach.md, DIR/results/data/reach.json "
                             "and regenerate DIR/results.md")
    parser.add_argument("--quick", action="store_true",
                        help="2 radii, 2 diagonal nets, 1 BERT batch, one model of each "
                             "family's quick variant (a smoke run)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the finished units of the run in --out")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads during the run (default 1)")


def add_summary_options(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce summary``."""
    parser.add_argument("--docs", type=str, default=Path("docs"), metavar="DIR",
                        help="docs folder of a checkout: reads DIR/results/data/*.json, "
                             "rewrites DIR/results/summary.md and DIR/results.md with the "
                             "renderer DIR/_hooks/results_pages (default docs)")


#: Study name -> (declares its options, the configuration its ``run`` takes).
STUDY_OPTIONS: dict[str, tuple[Callable[[argparse.ArgumentParser], None],
                              type[ReproduceConfig]]] = {
    "diagonal": (add_diagonal_options, DiagonalConfig),
    "vit": (partial(_add_family_options, name="vit", sizes=VIT_SIZES), FamilyConfig),
    "bert": (partial(_add_family_options, name="bert", sizes=BERT_SIZES), FamilyConfig),
    "invariance": (add_invariance_options, InvarianceConfig),
    "minilm": (partial(_add_family_options, name="minilm", sizes=MINILM_SIZES), FamilyConfig),
    "vit-finetune": (partial(_add_family_options, name="vit-finetune",
                             sizes=VIT_FINETUNE_SIZES), FamilyConfig),
    "lora": (partial(_add_family_options, name="lora", sizes=LORA_SIZES), FamilyConfig),
    "summary": (add_summary_options, SummaryConfig),
    "reach": (add_reach_options, ReachConfig),
}


def study_config(args: argparse.Namespace) -> ReproduceConfig:
    """The configuration of ``args.study`` from its parsed options (an option the namespace
    lacks keeps the field's default); a value it refuses is an ``InputError`` naming the option
    (``n-iter``) where the configuration's names the field (``n_iter``)."""
    _, config_class = STUDY_OPTIONS[args.study]
    given = vars(args)
    values = {field.name: given[field.name] for field in dataclasses.fields(config_class)
              if field.name in given}
    try:
        config = config_class(**values)
    except (TypeError, ValueError) as err:
        field, _, rest = str(err).partition(" ")
        raise InputError(f"{field.replace('_', '-')} {rest}") from err
    # read with --full only, as their help says: without it they were ignored without a word
    for name in ("rhos", "per_net_seeds"):
        if values.get(name) is not None and not values.get("full"):
            option = f"--{name.replace('_', '-')}"
            raise InputError(f"{option} applies with --full only (the rho sweep and the "
                             f"training set per net run there): add --full, or leave {option} "
                             "out")
    return config
