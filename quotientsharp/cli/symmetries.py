"""``quotientsharp symmetries MODEL``: print the symmetries a model carries.

MODEL is a HuggingFace config JSON file, a directory holding ``config.json`` (the architecture
is built from the config alone, on the meta device: no weights, no download), or a file saved
with ``torch.save(module)`` (a ``peft.PeftModel`` included), or a saved PEFT LoRA adapter
directory (``adapter_config.json``; the base model's ``config.json`` beside it or in the local
directory its ``base_model_name_or_path`` names): each adapter is listed with its rank.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from quotientsharp.cli import main as console_main
from quotientsharp.cli import plain_text, warning_notes
from quotientsharp.workflows.options import InputError

if TYPE_CHECKING:       # torch is imported when a command runs, not for --help
    from quotientsharp.models.report import SymmetryReport


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``symmetries`` subcommand on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "symmetries", help="list the symmetry groups (attention GL(h) pairs, diagonal GL(1)) of a "
        "model", description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="HuggingFace config JSON, a directory with config.json, "
                        "a saved PEFT adapter directory (adapter_config.json, with the base "
                        "model's config.json beside it), or a torch.save'd nn.Module file")
    parser.add_argument("--diagonal", action="append", default=[], metavar="U,V",
                        help="declare parameters U and V a diagonal parameterisation "
                        "(repeatable)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.set_defaults(func=run)


def report_to_dict(report: SymmetryReport) -> dict:
    """JSON-serialisable view of a report."""
    return {
        "model_type": report.model_type,
        "gl_count": report.gl_count,
        "group_count": report.group_count,
        "group_dimension": report.group_dimension,
        "diagonal_size": report.diagonal_size,
        "buckets": [{"n": n, "m": m, "h": h, "pairs": c}
                    for (n, m, h), c in report.bucket_shapes.items()],
        "modules": [{"name": mod.name, "type": mod.type_name, "layout": mod.layout,
                     "heads": mod.heads, "kv_heads": mod.kv_heads, "kinds": list(mod.kinds)}
                    for mod in report.modules],
        "pairs": [{**vars(pair), "group": pair.group} for pair in report.pairs],
        "diagonal": [vars(pair) for pair in report.diagonal],
        "parameter_counts": {"pairs": report.pair_parameter_count,
                             "diagonal": report.diagonal_parameter_count,
                             "other": report.other_parameter_count,
                             "frozen": report.frozen_parameter_count},
        "other": report.other,
        "frozen": report.frozen,
        "unknown": [{"module": name, "reason": report.unknown_reasons.get(name, "")}
                    for name in report.unknown],
        "notes": report.notes,
        "adapters": [{**vars(adapter), "group": adapter.group} for adapter in report.adapters],
    }


def run(args: argparse.Namespace) -> int:
    """Execute the subcommand; returns the process exit status."""
    diagonal = []
    for item in args.diagonal:
        first, _, second = item.partition(",")
        if not first or not second or "," in second:
            raise InputError(f"--diagonal expects U,V, got {item!r}")
        diagonal.append((first, second))
    from quotientsharp.models.loading import load_model
    from quotientsharp.models.walker import find_symmetries

    try:
        # the warnings of loading become notes; those of find_symmetries (a degenerate LoRA
        # adapter) are dropped, as its report, printed in full, notes what they say
        with warning_notes() as notes:
            model = load_model(args.model)
        with warning_notes():
            report = find_symmetries(model, diagonal=diagonal or None)
    except (OSError, ValueError, TypeError, RuntimeError) as err:
        print(f"quotientsharp symmetries: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report_to_dict(report), indent=2))
    else:
        print(report.summary())
    for note in notes:
        # stdout holds the JSON alone with --json
        print(f"note: {note}", file=sys.stderr if args.json else sys.stdout)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m quotientsharp.cli.symmetries MODEL``."""
    arguments = list(argv) if argv is not None else sys.argv[1:]
    if not arguments or arguments[0] != "symmetries":
        arguments = ["symmetries", *arguments]
    return console_main(arguments)


if __name__ == "__main__":
    raise SystemExit(main())
