"""Loading a saved PEFT LoRA adapter offline: a directory with adapter_config.json, on the base
PEFT's ``AutoPeftModelFor...`` would build (for discovery alone, from a ``config.json`` on the
meta device); every adapter is checked to hold its saved values, so that a fresh one is never
measured in its place. ``peft``, ``transformers`` and ``safetensors`` are imported only here.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.core.scalars import shortened
from quotientsharp.models.files import _config_model, first_line, load_torch_file, read_json_file

if TYPE_CHECKING:
    from torch import nn

#: The file that marks a directory as a saved PEFT adapter.
ADAPTER_CONFIG = "adapter_config.json"
#: The name PEFT gives the adapter it saves into the directory itself.
DEFAULT_ADAPTER = "default"


#: The weight files ``save_pretrained`` writes for a whole model (one file, or shards and
#: their index).
_MODEL_WEIGHTS = ("model*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin",
                  "pytorch_model.bin.index.json")


def saved_adapters(path: str | Path) -> list[tuple[str, Path]]:
    """The adapters saved in directory ``path`` as ``(name, folder)`` (PEFT's layout):
    ``("default", path)`` when ``path`` holds ``adapter_config.json``, then each subdirectory
    holding one, named after it, in sorted order. Empty when there is none, and when ``path``
    holds no ``adapter_config.json`` but a whole model (``config.json`` and its weights): that
    model is the one saved there, its subdirectories are others (a Trainer's
    ``checkpoint-*`` folders)."""
    path = Path(path)
    if not path.is_dir():
        return []
    found = [(DEFAULT_ADAPTER, path)] if (path / ADAPTER_CONFIG).is_file() else []
    if not found and (path / "config.json").is_file() and any(
            weights.is_file() for pattern in _MODEL_WEIGHTS for weights in path.glob(pattern)):
        return []
    found += [(child.name, child) for child in sorted(path.iterdir())
              if child.is_dir() and (child / ADAPTER_CONFIG).is_file()]
    _check_adapter_names(path, found)
    return found


def _check_adapter_names(path: Path, found: list[tuple[str, Path]]) -> None:
    """Refuse subdirectories whose names PEFT cannot give an adapter: ``default`` beside the
    directory's own adapter (one would replace the other) or a name with a dot (torch's
    module names have none); PEFT never writes either. Refuse, too, a directory without an
    adapter of its own that holds several Trainer checkpoints (``checkpoint-N``): the first
    name in sorted order would be measured, which is not the latest."""
    checkpoints = sorted((name for name, folder in found
                          if folder != path and re.fullmatch(r"checkpoint-\d+", name)),
                         key=lambda name: int(name.split("-")[1]))
    if len(checkpoints) > 1 and found[0][1] != path:
        raise ValueError(f"MODEL {path}: holds {len(checkpoints)} Trainer checkpoints "
                         f"({shortened(checkpoints, 6)}) and no adapter of its own: which "
                         "one to measure is not clear (the first name in sorted order would "
                         f"be). Give MODEL as the checkpoint folder itself, e.g. "
                         f"{path / checkpoints[-1]} (the latest)")
    for name, folder in found:
        if folder == path:
            continue
        if name == DEFAULT_ADAPTER and found[0][1] == path:
            raise ValueError(f"MODEL {path}: {folder} holds a saved adapter, and {path} holds "
                             f"its own, which PEFT names {DEFAULT_ADAPTER!r} too: one would be "
                             "measured in place of the other. Rename or move the subdirectory, "
                             "or give MODEL as the adapter directory itself")
        if "." in name:
            raise ValueError(f"MODEL {path}: the subdirectory {name!r} holds a saved adapter, but "
                             "a name with a '.' cannot be an adapter's (PEFT names each "
                             "subdirectory's adapter after it). Rename the subdirectory, or "
                             "give MODEL as the adapter directory itself")


def local_base(settings: dict[str, Any]) -> Path | None:
    """The local directory ``base_model_name_or_path`` names (relative to the working
    directory, as PEFT reads it), else ``None``: a Hub name is never looked up."""
    base = settings.get("base_model_name_or_path")
    return Path(base) if isinstance(base, str) and base and Path(base).is_dir() else None


def adapter_bases(path: str | Path) -> list[Path]:
    """The local base model directories of the adapters saved in ``path`` (empty for anything
    else): inputs of a measurement of ``path`` as much as the adapters are. A file that cannot
    be read gives none here; loading it names the fault."""
    try:
        adapters = saved_adapters(path)
    except ValueError:
        return []
    bases = []
    for _, folder in adapters:
        with contextlib.suppress(OSError, ValueError):
            settings = read_json_file(folder / ADAPTER_CONFIG, "MODEL")
            base = local_base(settings) if isinstance(settings, dict) else None
            bases += [] if base is None else [base]
    return bases


def _no_local_base(folder: Path, settings: dict[str, Any], discovery: bool) -> str:
    """One line for an adapter whose base model is not a local directory, and what to do."""
    base = settings.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        what = "names no base model (base_model_name_or_path)"
    else:
        beside = ((folder / base).resolve() if not Path(base).is_absolute()
                  and (folder / base).is_dir() else None)
        hint = "" if beside is None else f"; from the adapter's folder it is {beside}"
        what = (f"names the base model {base!r}, which is not a directory here (relative paths "
                f"are read from the current working directory, {Path.cwd()}, as PEFT reads "
                f"them; Hub names are never downloaded{hint})")
    todo = ("set base_model_name_or_path to the local directory that save_pretrained wrote the "
            "base model to" + (f", or put the base model's config.json beside {ADAPTER_CONFIG} "
                               "(symmetries need only the architecture)" if discovery else ""))
    return f"MODEL {folder}: {ADAPTER_CONFIG} {what}: {todo}"


def _base_config(path: Path, folder: Path, settings: dict[str, Any]) -> Path:
    """The base model's ``config.json``: in the saved directory ``path``, beside the adapter's
    own ``folder``, or in the local base directory."""
    local = local_base(settings)
    for candidate in (path / "config.json", folder / "config.json",
                      *([] if local is None else [local / "config.json"])):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(_no_local_base(folder, settings, discovery=True))


def _load_values(model: nn.Module, saved: dict[str, Any], adapter: str) -> None:
    """Replace the adapter's meta parameters by its ``saved`` tensors."""
    from torch import nn

    for name, module in model.named_modules():
        for local, parameter in list(module._parameters.items()):
            if parameter is None or not parameter.is_meta:
                continue
            # PEFT saves "...lora_A.weight" for "...lora_A.<adapter>.weight" (and
            # "...lora_embedding_A" for "...lora_embedding_A.<adapter>")
            full = f"{name}.{local}" if name else local
            key = full.replace(f".modules_to_save.{adapter}.", ".").replace(f".{adapter}.", ".")
            if key.endswith(f".{adapter}"):
                key = key[: -len(adapter) - 1]
            if key in saved and tuple(saved[key].shape) == tuple(parameter.shape):
                module._parameters[local] = nn.Parameter(
                    saved[key].to(parameter.dtype), requires_grad=parameter.requires_grad)


def _lora_settings(folder: Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json``, checked to be a LoRA adapter's."""
    settings = read_json_file(folder / ADAPTER_CONFIG, "MODEL")
    if not isinstance(settings, dict) or str(settings.get("peft_type", "")).upper() != "LORA":
        raise ValueError(f"MODEL {folder / ADAPTER_CONFIG}: peft_type "
                         f"{settings.get('peft_type') if isinstance(settings, dict) else None!r}"
                         ", only LoRA adapters are supported")
    return settings


#: PEFT's ``task_type`` -> the transformers class its ``AutoPeftModelFor...`` builds the base
#: with (so that the head saved in ``modules_to_save`` has a module to load into).
TASK_CLASSES = {
    "SEQ_CLS": "AutoModelForSequenceClassification",
    "TOKEN_CLS": "AutoModelForTokenClassification",
    "CAUSAL_LM": "AutoModelForCausalLM",
    "SEQ_2_SEQ_LM": "AutoModelForSeq2SeqLM",
    "QUESTION_ANS": "AutoModelForQuestionAnswering",
    "FEATURE_EXTRACTION": "AutoModel",
}
#: The warnings building a base and injecting saved adapters raise that the user did not
#: cause (this module reports what matters itself: adapter values that do not load).
_BUILD_WARNINGS = (
    r".*copying from a non-meta parameter",
    r".*[Ff]ound missing adapter keys",
    r".*is_gradient_checkpointing.* is deprecated",
    r".*[Ss]ome weights of .* were not initialized",
    r".*were not used when initializing",
)


@contextlib.contextmanager
def _quiet_build() -> Iterator[None]:
    """Silence :data:`_BUILD_WARNINGS`, transformers' load report and progress bars."""
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            for message in _BUILD_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def _target_class(settings: dict[str, Any]) -> Any:
    """The transformers class PEFT builds the base with: from ``task_type``, else from the
    ``auto_mapping`` PEFT records for a model without a task type; ``None`` when neither says
    (the base config's ``architectures`` decide)."""
    import transformers

    if (task := settings.get("task_type")) is not None:
        if (name := TASK_CLASSES.get(str(task))) is None:
            raise ValueError(f"adapter_config.json: task_type {task!r} is not one of "
                             f"{sorted(TASK_CLASSES)}")
        return getattr(transformers, name)
    mapping = settings.get("auto_mapping")
    if isinstance(mapping, dict) and str(mapping.get("parent_library", "")).startswith(
            "transformers"):
        return getattr(transformers, str(mapping.get("base_model_class")), None)
    return None


def _saved_tensors(folder: Path) -> dict[str, Any]:
    """The tensors of the adapter saved in ``folder`` (safetensors or ``.bin``); a damaged
    file, or one without tensors, is a ``ValueError`` naming it."""
    weights = folder / "adapter_model.safetensors"
    if weights.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            tensors = dict(load_file(str(weights)))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"MODEL {weights} cannot be read ({first_line(err)}): damaged or "
                             "truncated? save the adapter again with save_pretrained") from err
    elif (weights := folder / "adapter_model.bin").is_file():
        loaded = load_torch_file(weights, "MODEL",
                                 "a safetensors file nor a torch.save'd state dict",
                                 weights_only=True)
        if not isinstance(loaded, dict):
            raise ValueError(f"MODEL {weights} holds a {type(loaded).__name__}, not the "
                             "adapter's state dict")
        tensors = dict(loaded)
    else:
        raise FileNotFoundError(f"MODEL {folder} has {ADAPTER_CONFIG} but no "
                                "adapter_model.safetensors or adapter_model.bin: the adapter's "
                                "values were not saved")
    if not tensors:
        # save_pretrained after merge_and_unload: the LoRA layers are gone, nothing is saved
        raise ValueError(f"MODEL {weights} holds no tensors: the adapter was saved "
                         "without values (after merge_and_unload? then save the merged model "
                         "that merge_and_unload returns with save_pretrained, and measure that)")
    return tensors


#: The names PEFT gives a classification head when it adds it to ``modules_to_save``.
_HEAD_NAMES = ("classifier", "score")


def _head_labels(settings: dict[str, Any], saved: dict[str, Any]) -> int | None:
    """The rows of a classification head saved in ``modules_to_save``, or ``None``."""
    if settings.get("task_type") not in ("SEQ_CLS", "TOKEN_CLS"):
        return None
    # the head first: PEFT appends its names to the user's modules_to_save (["pooler.dense",
    # "classifier", "score"]), whose own rows are not the labels
    modules = list(settings.get("modules_to_save") or [])
    for module in sorted(modules, key=lambda name: name not in _HEAD_NAMES):
        for key in (f".{module}.weight", f".{module}.out_proj.weight"):
            rows = [t.shape[0] for k, t in saved.items() if k.endswith(key) and t.ndim == 2]
            if rows:
                return int(rows[0])
    return None


def _local_base_model(load: Any, local: Path,
                      extra: dict[str, Any]) -> tuple[nn.Module, list[str], list[str]]:
    """The base model read by ``load`` (a transformers class) from the directory ``local``;
    the names of its tensors that the weights do not give (missing, or of another shape:
    built fresh); and the names of the saved tensors it has no place for."""
    with _quiet_build():
        # a head of another shape (num_labels changed for fine-tuning) is built fresh, like a
        # missing one: the adapter must save it (_check_base_weights)
        model, info = load.from_pretrained(str(local), local_files_only=True,
                                           attn_implementation="eager",
                                           output_loading_info=True,
                                           ignore_mismatched_sizes=True, **extra)
    mismatched = [entry[0] if isinstance(entry, (tuple, list)) else str(entry)
                  for entry in info.get("mismatched_keys") or []]
    return (model, list(info.get("missing_keys") or []) + mismatched,
            list(info.get("unexpected_keys") or []))


def _base_model(path: Path, folder: Path, settings: dict[str, Any], labels: int | None,
                weights: bool) -> tuple[nn.Module, list[str], list[str]]:
    """The base model as PEFT builds it (the class of :func:`_target_class`, from the local
    base directory; without ``weights``, else from its config on the meta device), and the
    names of :func:`_local_base_model`; nothing is downloaded."""
    import torch
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    target = _target_class(settings)
    local = local_base(settings)
    extra: dict[str, Any] = {} if labels is None else {"num_labels": labels}
    if local is not None:
        try:
            return _local_base_model(target or transformers.AutoModel, local, extra)
        except ImportError as err:
            # transformers asks for a package its config needs (bitsandbytes for a base saved
            # quantised); discovery reads the architecture from the config instead
            if weights:
                raise RuntimeError(
                    f"MODEL {folder}: {ADAPTER_CONFIG} names the base model {str(local)!r}, "
                    "which transformers cannot load without a package that is not installed "
                    f"here ({first_line(err)})") from err
        except (OSError, ValueError) as err:
            if weights:
                raise FileNotFoundError(
                    f"MODEL {folder}: {ADAPTER_CONFIG} names the base model {str(local)!r}, "
                    f"which cannot be loaded with its weights ({first_line(err)}); the adapter "
                    "is measured on its base: make base_model_name_or_path a local directory "
                    "written by save_pretrained") from err
    elif weights:
        raise FileNotFoundError(_no_local_base(folder, settings, discovery=False))
    config_file = _base_config(path, folder, settings)
    if target is None:
        return _config_model(config_file), [], []
    # transformers' message for a broken config.json names neither MODEL nor the reason
    read_json_file(config_file, "MODEL")
    config = transformers.AutoConfig.from_pretrained(str(config_file.parent),
                                                     local_files_only=True, **extra)
    with torch.device("meta"), _quiet_build():
        if hasattr(target, "from_config"):
            return target.from_config(config, attn_implementation="eager"), [], []
        return target(config), [], []


def _adapter_state(model: nn.Module, adapter: str, saved: dict[str, Any]) -> dict[str, Any]:
    """The values of ``adapter`` as PEFT saves them, with the embedding layers when the saved
    file holds them (PEFT's ``"auto"`` would ask the Hub whether the vocabulary was resized)."""
    import peft

    state = peft.get_peft_model_state_dict(model, adapter_name=adapter,
                                           save_embedding_layers=False)
    if set(saved) <= set(state):
        return state
    with warnings.catch_warnings():
        # PEFT says it could not find them, on a model without embeddings: then none are saved
        warnings.filterwarnings("ignore", message=r".*[Cc]ould not identify embedding")
        with_embeddings = peft.get_peft_model_state_dict(model, adapter_name=adapter,
                                                         save_embedding_layers=True)
    added = set(with_embeddings) - set(state)
    return with_embeddings if added and added <= set(saved) else state


def _check_loaded(model: nn.Module, folder: Path, adapter: str,
                  saved: dict[str, Any]) -> None:
    """Refuse a model whose adapter ``adapter`` does not hold every saved value: keys the
    model expects but the file lacks, keys the model has no place for, or other values."""
    import torch

    state = _adapter_state(model, adapter, saved)
    missing = sorted(set(state) - set(saved))
    unused = sorted(set(saved) - set(state))
    other = sorted(k for k in set(state) & set(saved)
                   if state[k].is_meta or state[k].shape != saved[k].shape
                   or not torch.equal(state[k].detach().cpu(),
                                      saved[k].to(state[k].dtype)))
    problems = [f"{len(keys)} {what} ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})"
                for what, keys in (("missing from the saved file", missing),
                                   ("saved for modules the model lacks", unused),
                                   ("with other values after loading", other)) if keys]
    if problems:
        raise ValueError(f"{folder}: the saved values of adapter {adapter!r} do not load into "
                         f"{type(getattr(model.base_model, 'model', model)).__name__}: tensors "
                         f"{'; '.join(problems)}; a fresh or partial adapter would be measured. "
                         "Save it again with save_pretrained from the model it was trained on, "
                         "or check base_model_name_or_path and task_type in "
                         f"{ADAPTER_CONFIG}")


def _check_base_weights(model: nn.Module, folder: Path, local: Path | None, missing: list[str],
                        unexpected: list[str], saved: dict[str, Any]) -> None:
    """Refuse base weights that lack tensors (a classification head) the active adapter does
    not save either, or that hold backbone tensors the model built from the base's
    ``config.json`` has no place for (heads of other tasks are dropped, as PEFT drops them)."""
    base = getattr(model.base_model, "model", model)
    fresh = sorted(name for name in missing if f"base_model.model.{name}" not in saved)
    if fresh:
        shown = shortened(fresh, 4)
        raise ValueError(f"MODEL {folder}: the base model {str(local)!r} has no weights (or "
                         f"weights of another shape) for {len(fresh)} tensor(s) of "
                         f"{type(base).__name__} ({shown}) and the adapter does not "
                         "save them: they would be measured freshly initialised, not as the "
                         "model the adapter was saved from. Save the adapter with those modules "
                         "in modules_to_save (task_type='SEQ_CLS' adds the classifier), or "
                         "point base_model_name_or_path at a base saved with them")
    prefix = str(getattr(base, "base_model_prefix", "") or "")
    backbone = getattr(base, prefix, base) if prefix else base
    children = {name for name, _ in backbone.named_children()}
    unused = sorted(key for key in unexpected
                    if key.removeprefix(f"{prefix}.").split(".")[0] in children)
    if unused:
        shown = shortened(unused, 4)
        raise ValueError(f"MODEL {folder}: the weights of the base model {str(local)!r} hold "
                         f"{len(unused)} tensor(s) that {type(base).__name__} built from its "
                         f"config.json has no place for ({shown}); they would be left out of "
                         "the model measured. Was the base's config.json edited or copied from "
                         "another model?")


def _with_adapters(base: nn.Module, adapters: list[tuple[str, Path]]) -> nn.Module:
    """PEFT's model of ``base`` with every adapter of ``adapters`` injected (the first active);
    PEFT's and torch's errors for a config that does not fit the saved file (an edited ``r``,
    ``target_modules`` matching nothing, ``modules_to_save`` dropped) name the adapter."""
    import peft

    name, folder = adapters[0]
    try:
        with _quiet_build():
            # on a meta base PEFT's copy of the saved values is a no-op: _load_values assigns
            model = peft.PeftModel.from_pretrained(base, str(folder), adapter_name=name,
                                                   is_trainable=True, local_files_only=True)
            for name, folder in adapters[1:]:
                model.load_adapter(str(folder), adapter_name=name, is_trainable=True,
                                   local_files_only=True)
    except (RuntimeError, ValueError, KeyError) as err:
        # PEFT's KeyError: a tensor that modules_to_save expects is not in the saved file
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = " ".join(lines[:2])
        detail = detail if len(detail) <= 300 else detail[:297] + "..."
        raise ValueError(f"MODEL {folder}: adapter {name!r} does not fit "
                         f"{type(base).__name__} as {ADAPTER_CONFIG} describes it "
                         f"({type(err).__name__}: {detail}); do r, target_modules, "
                         f"modules_to_save and task_type in {ADAPTER_CONFIG} match the saved "
                         "adapter and its base?") from err
    return model


def load_peft_directory(path: str | Path, weights: bool = False) -> nn.Module:
    """A ``peft.PeftModel`` from the directory ``path`` that ``save_pretrained`` wrote, every
    saved adapter loaded under its name (trainable) and checked to hold its saved values; with
    ``weights=False`` (discovery) the base may be built from its config on the meta device.

    Raises ``RuntimeError`` without ``peft``; ``FileNotFoundError`` or ``ValueError`` when there
    is no saved adapter, no base offline, an adapter not LoRA, or values that do not load.
    """
    path = Path(path)
    adapters = saved_adapters(path)
    if not adapters:
        raise FileNotFoundError(f"MODEL {path} holds no saved PEFT adapter ({ADAPTER_CONFIG} in it "
                                "or in a subdirectory named after the adapter)")
    settings = {name: _lora_settings(folder) for name, folder in adapters}
    try:
        import peft  # noqa: F401 - checked here, used by _with_adapters
    except ImportError as err:
        raise RuntimeError("reading a saved PEFT adapter needs the 'peft' package "
                           "(pip install quotientsharp[lora])") from err

    first, first_folder = adapters[0]
    saved = {name: _saved_tensors(folder) for name, folder in adapters}
    base, missing, unused = _base_model(path, first_folder, settings[first],
                                        _head_labels(settings[first], saved[first]), weights)
    model = _with_adapters(base, adapters)
    if weights:     # discovery reads the structure alone: a fresh head does not change it
        _check_base_weights(model, first_folder, local_base(settings[first]), missing, unused,
                            saved[first])
    for name, folder in adapters:
        _load_values(model, saved[name], name)
        _check_loaded(model, folder, name, saved[name])
    return model
