"""``quotientsharp symmetries MODEL``: print the symmetries a model carries.

MODEL is a HuggingFace config JSON file, a directory holding ``config.json`` (the architecture
is built from the config alone, on the meta device: no weights, no download), or a file saved
with ``torch.save(module)``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:       # torch is imported when a command runs, not for --help
    from torch import nn

    from .report import SymmetryReport

__all__ = ["add_parser", "load_model", "main", "report_to_dict", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``symmetries`` subcommand on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "symmetries", help="list the symmetry groups (attention GL(h) pairs, diagonal GL(1)) of a "
        "model", description=_plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="HuggingFace config JSON, a directory with config.json, "
                        "or a torch.save'd nn.Module file")
    parser.add_argument("--diagonal", action="append", default=[], metavar="U,V",
                        help="declare parameters U and V a diagonal parameterisation "
                        "(repeatable)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.set_defaults(func=run)
    return parser


def _plain(text: str | None) -> str | None:
    from ..commands import plain_text

    return plain_text(text)


def _config_model(config_file: Path) -> nn.Module:
    import torch
    from torch import nn

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as err:
        raise RuntimeError("reading a HuggingFace config needs the 'transformers' package "
                           "(pip install quotientsharp[hf])") from err
    with config_file.open() as handle:
        data = json.load(handle)
    if not isinstance(data, dict) or "model_type" not in data:
        raise ValueError(f"{config_file} is not a HuggingFace config: no 'model_type' entry")
    model_type = data["model_type"]
    try:
        config_class = transformers.CONFIG_MAPPING[model_type]
    except KeyError as err:
        raise ValueError(f"{config_file}: model_type {model_type!r} is unknown to transformers "
                         f"{transformers.__version__}") from err
    config = config_class.from_dict(data)
    architectures = data.get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    # meta tensors: the architecture without allocating (or initialising) any weights
    with torch.device("meta"):
        if isinstance(model_class, type) and issubclass(model_class, nn.Module):
            return model_class(config)
        return transformers.AutoModel.from_config(config)


def load_model(path: str | os.PathLike) -> nn.Module:
    """Build or load the module that ``path`` describes (see the module docstring)."""
    import torch
    from torch import nn

    path = Path(path)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"MODEL directory {path} has no config.json")
        return _config_model(config_file)
    if not path.is_file():
        raise FileNotFoundError(f"MODEL {path} does not exist")
    if path.suffix == ".json":
        return _config_model(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=False)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        with path.open("rb") as handle:
            if handle.read(1) == b"{":
                return _config_model(path)
        raise ValueError(f"MODEL {path} is neither a config JSON nor a torch-saved module: "
                         f"{err}") from err
    if isinstance(loaded, nn.Module):
        return loaded
    if isinstance(loaded, dict):
        raise ValueError(f"MODEL {path} holds a {type(loaded).__name__} (a state dict?), not a "
                         "module: symmetry discovery needs the architecture; save the module "
                         "itself with torch.save(model, path)")
    raise ValueError(f"MODEL {path} holds a {type(loaded).__name__}, not a torch.nn.Module")


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
    }


def run(args: argparse.Namespace) -> int:
    """Execute the subcommand; returns the process exit status."""
    diagonal = []
    for item in args.diagonal:
        parts = item.split(",")
        if len(parts) != 2 or not all(parts):
            print(f"quotientsharp symmetries: error: --diagonal expects U,V, got {item!r}",
                  file=sys.stderr)
            return 2
        diagonal.append((parts[0], parts[1]))
    from .walker import find_symmetries

    try:
        model = load_model(args.model)
        report = find_symmetries(model, diagonal=diagonal or None)
    except (OSError, ValueError, TypeError, RuntimeError) as err:
        print(f"quotientsharp symmetries: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report_to_dict(report), indent=2))
    else:
        print(report.summary())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m quotientsharp.models.cli MODEL``."""
    parser = argparse.ArgumentParser(prog="quotientsharp")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_parser(subparsers)
    arguments = list(argv) if argv is not None else sys.argv[1:]
    if not arguments or arguments[0] != "symmetries":
        arguments = ["symmetries", *arguments]
    args = parser.parse_args(arguments)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
