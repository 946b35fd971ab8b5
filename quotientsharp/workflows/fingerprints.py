"""What a finished record was measured from, by content: the identity checked on ``--resume``
(a checkpoint replaced at the same path would keep its stale record): the SHA-256 of every file
measured, and of a user's symmetry, its modules' source and its bindings."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quotientsharp.workflows.manifest import ManifestEntry

#: Top-level packages whose code the recorded versions identify (not hashed file by file).
_VERSIONED = ("quotientsharp", "torch", "builtins")

_CACHE: dict[tuple[str, int, int], str] = {}


def _file_sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _CACHE:
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        _CACHE[key] = digest.hexdigest()
    return _CACHE[key]


def content_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, or of a folder's files (relative names and hashes, sorted;
    hidden files left out)."""
    path = Path(path)
    if not path.is_dir():
        return _file_sha256(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*")
                   if p.is_file() and not any(part.startswith(".")
                                              for part in p.relative_to(path).parts))
    for file in files:
        digest.update(f"{file.relative_to(path).as_posix()}\0{_file_sha256(file)}\n".encode())
    return digest.hexdigest()


def _adapter_bases(model: Path) -> list[Path]:
    """The local base model directories of the PEFT adapters saved in ``model`` (none for a
    file, a whole saved model, or an adapter whose base is not a local directory)."""
    from quotientsharp.models.peft_loading import ADAPTER_CONFIG, local_base, saved_adapters

    bases = []
    for _, folder in saved_adapters(model):
        try:
            settings = json.loads((folder / ADAPTER_CONFIG).read_text())
        except (OSError, ValueError):
            continue                    # loading the adapter names what is wrong with it
        base = local_base(settings) if isinstance(settings, dict) else None
        if base is not None:
            bases.append(base)
    return bases


def content_identity(entry: ManifestEntry) -> dict[str, Any]:
    """:meth:`ManifestEntry.identity` with the SHA-256 of the model and the gap's data, and,
    for a saved PEFT adapter, of the base model it is measured on (``base_sha256``: a base
    retrained in place, or another one reached from another working directory, changes every
    value while the adapter's folder stays the same)."""
    identity: dict[str, Any] = dict(entry.identity())
    for key, path in (("model", entry.model), ("train", entry.train), ("test", entry.test)):
        identity[f"{key}_sha256"] = None if path is None else content_sha256(path)
    bases = _adapter_bases(entry.model)
    if bases:
        identity["base_sha256"] = [content_sha256(base) for base in bases]
    return identity


def _user_modules(objects: Sequence[Any]) -> dict[str, str]:
    """Module name -> source file of the user modules defining ``objects`` (and, for classes,
    their bases)."""
    modules: dict[str, str] = {}
    for obj in objects:
        owners = inspect.getmro(obj) if inspect.isclass(obj) else (obj,)
        for owner in owners:
            name = getattr(owner, "__module__", None)
            if not isinstance(name, str) or name.partition(".")[0] in _VERSIONED:
                continue
            module = sys.modules.get(name)
            file = getattr(module, "__file__", None)
            if isinstance(file, str) and Path(file).is_file():
                modules[name] = file
    return modules


def _describe(value: Any) -> Any:
    """A JSON-able description of one setting of a quotient (tensors by the hash of their
    bytes, other objects by class and name)."""
    import torch

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_describe(v) for v in value]
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        return {"tensor": list(data.shape), "dtype": str(data.dtype),
                "sha256": hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes()
                                         if data.numel() else b"").hexdigest()}
    kind = type(value)
    return {"object": f"{kind.__module__}.{kind.__qualname__}",
            **({"name": value.name} if isinstance(getattr(value, "name", None), str) else {})}


def _binding_description(binding: Any) -> dict[str, Any]:
    quotient = binding.quotient
    kind = type(quotient)
    settings = {key: _describe(value) for key, value in sorted(vars(quotient).items())
                if not key.startswith("_") and key != "training"}
    tensors = {key: _describe(value) for key, value in quotient.state_dict().items()}
    return {"name": binding.name, "parameters": list(binding.parameters),
            "folded": binding.folded, "quotient": f"{kind.__module__}.{kind.__qualname__}",
            "settings": settings, "tensors": tensors,
            "to_point": getattr(binding.to_point, "__qualname__", None),
            "from_point": getattr(binding.from_point, "__qualname__", None)}


def symmetry_fingerprint(function: Any, bindings: Sequence[Any]) -> dict[str, Any]:
    """What a user's symmetry ``function`` (``--symmetry MODULE:FUNCTION``) and the
    ``bindings`` it returned are, by content: ``{"modules": {module: sha256 of its source
    file}, "bindings": sha256}``."""
    objects: list[Any] = [function]
    for binding in bindings:
        objects += [type(binding.quotient), binding.to_point, binding.from_point]
    modules = _user_modules([o for o in objects if o is not None])
    described = json.dumps([_binding_description(b) for b in bindings], sort_keys=True)
    return {"modules": {name: _file_sha256(Path(file)) for name, file in sorted(modules.items())},
            "bindings": hashlib.sha256(described.encode()).hexdigest()}


def fingerprint_change(saved: Any, now: Mapping[str, Any]) -> str | None:
    """What differs between a recorded :func:`symmetry_fingerprint` and the current one, in a
    few words, or ``None``."""
    if not isinstance(saved, Mapping):
        return "the record predates symmetry fingerprints"
    old, new = saved.get("modules") or {}, now["modules"]
    changed = [name for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
    if changed:
        return "the source of module(s) " + ", ".join(changed) + " changed"
    if saved.get("bindings") != now["bindings"]:
        return ("the bindings it returns changed (their names, parameters, quotient class, "
                "metric or settings)")
    return None
