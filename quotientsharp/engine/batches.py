"""Batches, model outputs and losses (validation and the functional model stages).

A batch is a pair ``(x, y)`` (``x`` a tensor, a tuple or list of positional inputs or a dict of
keyword inputs; ``y`` the target) or a HuggingFace-style dict with a ``"labels"`` entry. The
model's output is a tensor, an object or dict with ``logits``, or a tuple whose first element
is the logits (:func:`output_tensor`). The loss is the mean cross-entropy (``ignore_index=-100``),
``"mse"``, or any callable ``loss(output, target)`` returning a scalar tensor.
"""

from __future__ import annotations

import difflib
import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from quotientsharp.core.scalars import shortened
from quotientsharp.models.symmetry_check import output_tensor

LossFunction = Callable[[Any, Any], torch.Tensor]
LOSS_NAMES = ("cross_entropy", "mse")


#: The label cross-entropy ignores (HuggingFace's and torch's default ``ignore_index``).
IGNORE_INDEX = -100


@dataclass
class Batch:
    """A batch split into model inputs and target; ``index`` (its position) names it in errors."""

    args: tuple
    kwargs: dict
    target: Any
    index: int | None = None

    @property
    def label(self) -> str:
        """``"batch i"`` (or ``"the batch"`` without an index), for error messages."""
        return "the batch" if self.index is None else f"batch {self.index}"


def _move(obj: Any, device: torch.device, float_dtype: torch.dtype | None,
          where: str = "the batch") -> Any:
    """Tensors to ``device``; floating input tensors to ``float_dtype`` when given."""
    if isinstance(obj, torch.Tensor):
        if obj.is_meta and device.type != "meta":
            # torch's own message ("Cannot copy out of meta tensor") names no tensor
            raise ValueError(f"{where} holds a tensor on the meta device (shape "
                             f"{tuple(obj.shape)}, no data): batches need real tensors")
        if float_dtype is not None and obj.is_floating_point():
            return obj.to(device=device, dtype=float_dtype)
        return obj.to(device=device)
    if isinstance(obj, Mapping):
        return {k: _move(v, device, float_dtype, f"{where}, entry {k!r},") for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(_move(v, device, float_dtype, f"{where}, item {i},")
                         for i, v in enumerate(obj))
    return obj


def few_names(names: Sequence[str]) -> str:
    """At most five names, and how many more."""
    return f"{list(names[:5])}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _nested_numbers(value: Any) -> tuple[tuple[int, ...], set[str]] | None:
    """The shape (ragged rows: the first row's) and the leaf types of a non-empty list or tuple
    whose leaves are all numbers, else ``None``."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if all(isinstance(v, numbers.Number) for v in value):
        return (len(value),), {type(v).__name__ for v in value}
    rows = [_nested_numbers(v) for v in value]
    known = [row for row in rows if row is not None]
    if len(known) < len(rows):
        return None
    return (len(value), *known[0][0]), set().union(*(kinds for _, kinds in known))


def _data_not_tensor(value: Any) -> str | None:
    """What ``value`` is when it holds data a model needs as a tensor (a NumPy array, numbers
    in Python lists); ``None`` otherwise (a tensor, a flag, a string, a list of tensors)."""
    if not isinstance(value, torch.Tensor) and hasattr(value, "__array__") \
            and len(getattr(value, "shape", ())) > 0:
        kind = type(value)
        dtype = getattr(value, "dtype", None)
        return (f"a {kind.__module__.split('.')[0]}.{kind.__name__} of shape "
                f"{tuple(value.shape)}" + (f" and dtype {dtype}" if dtype is not None else ""))
    found = _nested_numbers(value)
    if found is None:
        return None
    kinds = "/".join(sorted(found[1]))
    return f"a Python {type(value).__name__} of {kinds} values (nested, shape {list(found[0])})"


def _entries(value: Any) -> list[tuple[Any, Any]]:
    """The ``(key or position, item)`` pairs of a dict, list or tuple; empty for others."""
    if isinstance(value, Mapping):
        return list(value.items())
    return list(enumerate(value)) if isinstance(value, (list, tuple)) else []


def _untensored(value: Any, where: str) -> tuple[str, str] | None:
    """The first ``(where, what)`` at or inside ``value`` that holds data but is no tensor."""
    found = _data_not_tensor(value)
    if found is not None:
        return where, found
    return next((inner for key, item in _entries(value)
                 if (inner := _untensored(item, f"{where}[{key!r}]")) is not None), None)


#: Keyword inputs of HuggingFace models that carry the keys and values of a cached prefix.
CACHE_KEYWORDS = ("past_key_values", "past_key_value", "cache_params", "mems")


def _check_not_a_cache(key: object, value: object, index: int) -> None:
    """Raise if an input is a key/value cache (a HuggingFace ``Cache`` object, or a non-empty
    value under one of :data:`CACHE_KEYWORDS`)."""
    is_cache = any(kind.__name__ == "Cache" and kind.__module__.startswith("transformers")
                   for kind in type(value).__mro__)
    if not (is_cache or (key in CACHE_KEYWORDS and value is not None
                         and not (isinstance(value, (tuple, list)) and not value))):
        return
    # the prefix's keys and values were computed at the unperturbed parameters, and the
    # forward appends to a Cache object at every evaluation
    raise ValueError(f"batch {index}: input {key!r} is a key/value cache "
                     f"({type(value).__name__}): it holds the keys and values of a prefix "
                     "computed at the unperturbed parameters, which no perturbation would reach, "
                     "and the forward appends to it at every evaluation; pass the whole "
                     "sequence (the prefix in input_ids) without a cache")


def check_input_types(inputs: Any, index: int) -> None:
    """Raise a ``TypeError`` naming batch ``index`` and the input (key or position) when an
    input holds data that is not a tensor: torch's own error, from inside the forward, names
    neither. ``inputs``: a dict of keyword inputs, a tuple or list of positional ones, or one."""
    whole = _data_not_tensor(inputs) if isinstance(inputs, (list, tuple)) else None
    if whole is not None:
        # the pair's inputs would be passed as one positional input per row
        raise TypeError(f"batch {index}: the inputs are {whole}, not a tensor: the model's "
                        "inputs must be torch tensors (torch.tensor(...) converts them)")
    for key, value in _entries(inputs) or [(0, inputs)]:
        _check_not_a_cache(key, value, index)
        found = _untensored(value, f"input {key!r}")
        if found is not None:
            raise TypeError(f"batch {index}: {found[0]} is {found[1]}, not a tensor: the "
                            "model's inputs must be torch tensors (torch.as_tensor(...) "
                            "converts it)")


@dataclass(frozen=True)
class ForwardKeywords:
    """A forward's named parameters (``*args``, ``**kwargs`` excluded), whether it also takes
    ``**kwargs`` (which swallow a misspelt key silently), and ``"{class}.forward"``."""

    names: tuple[str, ...]
    takes_kwargs: bool
    owner: str


def forward_keywords(model: Any) -> ForwardKeywords | None:
    """The named parameters of ``model.forward``, or ``None`` where it has none or no
    signature. A wrapper whose ``**kwargs`` reach the model it wraps (PEFT's
    ``get_base_model()``) also takes that model's (``token_type_ids`` of a BERT under LoRA)."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (AttributeError, TypeError, ValueError):    # no forward, or no signature
        return None
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    names = tuple(p.name for p in parameters if p.kind not in variadic)
    if not names:
        return None
    owner = f"{type(model).__name__}.forward"
    takes_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)
    wrapped = getattr(model, "get_base_model", None)
    inner = wrapped() if takes_kwargs and callable(wrapped) else None
    if inner is not None and inner is not model:
        passed = forward_keywords(inner)
        if passed is not None:
            names += tuple(n for n in passed.names if n not in names)
            owner += f" (and {passed.owner}, which its **kwargs reach)"
            takes_kwargs = passed.takes_kwargs
    return ForwardKeywords(names, takes_kwargs, owner)


def check_keywords(batch: Batch, forward: ForwardKeywords | None) -> None:
    """Raise a ``ValueError`` naming the batch and a keyword input that is not a parameter of
    the forward, with the closest name: a forward with ``**kwargs`` would ignore it silently."""
    if forward is None:
        return
    for key in batch.kwargs:
        if key in forward.names:
            continue
        # a difference of case first (difflib finds no likeness between 'X' and 'x')
        close = ([n for n in forward.names if n.lower() == str(key).lower()]
                 or difflib.get_close_matches(str(key), forward.names, n=1))
        shown = shortened(forward.names, 12)
        raise ValueError(
            f"{batch.label}: input {key!r} is not a parameter of {forward.owner}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + ("; its **kwargs would take it and ignore it" if forward.takes_kwargs else "")
            + f"; its parameters: {shown}")


def split_batch(batch: Any, index: int, device: torch.device,
                input_dtype: torch.dtype | None) -> Batch:
    """Split one batch into inputs and target, moved to ``device``.

    Parameters
    ----------
    batch
        ``(x, y)`` or a dict with ``"labels"`` (see the module docstring).
    index
        Position of the batch, for error messages.
    device
        The model's device.
    input_dtype
        Floating inputs are cast to it (the model's parameter dtype), targets are only moved.
    """
    if isinstance(batch, Mapping):
        if "labels" not in batch:
            hint = ("; rename 'label' (a dataset's column name) to 'labels'" if "label" in batch
                    else "")
            raise ValueError(f"batch {index} is a dict without a 'labels' entry (keys: "
                             f"{sorted(map(str, batch))}){hint}")
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        check_input_types(inputs, index)
        return Batch((), _move(inputs, device, input_dtype, f"batch {index}"),
                     _move(batch["labels"], device, None, f"batch {index}'s labels"), index)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        check_input_types(x, index)
        target = _move(y, device, None, f"batch {index}'s target")
        where = f"batch {index}'s inputs"
        if isinstance(x, Mapping):
            return Batch((), _move(dict(x), device, input_dtype, where), target, index)
        if isinstance(x, (tuple, list)):
            return Batch(tuple(_move(list(x), device, input_dtype, where)), {}, target, index)
        return Batch((_move(x, device, input_dtype, where),), {}, target, index)
    # a tensor batch: batches yields tensors (a single (x, y) pair, or a loader over inputs)
    hint = (": batches must yield (inputs, target) pairs, so was one (x, y) pair passed as "
            "batches? pass [(x, y)]" if isinstance(batch, torch.Tensor) else "")
    raise TypeError(f"batch {index} must be an (inputs, target) pair or a dict with 'labels', "
                    f"got {type(batch).__name__}"
                    + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
                    + hint)


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over class indices (``-100`` ignored) of shape ``logits.shape[:-1]``
    (flattened) or ``[B, d1, ...]`` for ``[B, C, d1, ...]`` logits, or class probabilities of
    the logits' shape; other targets raise, naming both shapes."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"the cross-entropy target must be a tensor, got {type(target).__name__}")
    if target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"cross-entropy needs integer class labels (or class probabilities), "
                        f"got a {str(target.dtype).removeprefix('torch.')} target")
    if target.is_floating_point():
        if target.shape != logits.shape:
            raise TypeError(
                f"cross-entropy got a {str(target.dtype).removeprefix('torch.')} target of shape "
                f"{_shape(target)} for logits of shape {_shape(logits)}: it needs integer class "
                "labels, or class probabilities of the logits' shape; for real-valued targets "
                "pass loss='mse'")
        return F.cross_entropy(logits, target)
    target = target.long()
    check_label_shape(logits, target)
    if logits.dim() > 2 and target.shape == logits.shape[:-1]:
        logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    return F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX)


def check_label_shape(logits: torch.Tensor, target: torch.Tensor) -> None:
    """Raise unless class labels of ``target``'s shape fit ``logits``: ``logits.shape[:-1]``
    (classes last) or ``[B, d1, ...]`` for ``[B, C, d1, ...]`` logits (classes second)."""
    if target.shape == logits.shape[:-1] or (
            logits.dim() > 2 and target.shape == (logits.shape[0], *logits.shape[2:])):
        return
    if target.shape == logits.shape and logits.dim() >= 1:
        # "same number of examples?" would point at the wrong thing: the shapes are equal
        raise ValueError(f"the labels are integers of the output's own shape {_shape(logits)} "
                         "(one-hot labels?): cross-entropy needs class indices of shape "
                         f"{_shape(logits)[:-1]} (labels.argmax(-1)) or floating class "
                         "probabilities of the output's shape")
    rows = (f"{logits.shape[0]} row{'s' if logits.shape[0] != 1 else ''}" if logits.dim() > 1
            else "one row")
    raise ValueError(f"the model's output has shape {_shape(logits)} ({rows} of "
                     f"{logits.shape[-1]} class scores) but the labels have shape "
                     f"{_shape(target)}: do the inputs and the labels hold the same number "
                     "of examples?")


def check_class_labels(logits: torch.Tensor, target: torch.Tensor) -> None:
    """Raise unless the labels' shape fits the logits (first: a label is out of range only of
    the classes it is matched with), every class label is in ``[0, C)`` or ``-100``, and not
    all are ``-100`` (before the loss: out of range is a device-side assert on CUDA)."""
    if isinstance(target, torch.Tensor) and target.is_floating_point() and target.numel() \
            and target.shape == logits.shape:
        _check_probabilities(target)
    if (not isinstance(target, torch.Tensor) or target.is_floating_point()
            or target.dtype == torch.bool or target.is_complex() or target.numel() == 0):
        return          # the loss's own check names a target of another dtype
    check_label_shape(logits, target)
    classes = logits.shape[-1] if (logits.dim() < 3 or target.shape == logits.shape[:-1]) \
        else logits.shape[1]
    ignored = target == IGNORE_INDEX
    invalid = ~ignored & ((target < 0) | (target >= classes))
    bad, skipped = torch.stack([invalid.sum(), ignored.sum()]).tolist()
    if bad:
        value = int(target[invalid].reshape(-1)[0])
        raise ValueError(f"label {value} is out of range: the model's output has {classes} "
                         f"classes, so a label must be in [0, {classes}) (or {IGNORE_INDEX}, "
                         f"ignored); {bad} of {target.numel()} labels are out of range")
    if skipped == target.numel():
        raise ValueError(f"every label is {IGNORE_INDEX} (the ignore_index): the cross-entropy "
                         "has no target to average, so the loss would be NaN")


def _check_probabilities(target: torch.Tensor) -> None:
    """Raise unless a floating cross-entropy target holds class probabilities: entries in
    ``[0, 1]``, summing to 1 over the classes (``F.cross_entropy``'s class dimension, the second
    of two or more), to ``1e-3`` or the rounding of the target's dtype. Real-valued targets would
    give a number that is no cross-entropy, silently."""
    values = target.detach().to(torch.float64)
    sums = values.sum(dim=1 if values.dim() >= 2 else 0)
    tolerance = max(1e-3, values.shape[1 if values.dim() >= 2 else 0]
                    * torch.finfo(target.dtype).eps)
    low, high, off = torch.stack([values.min(), values.max(),
                                  (sums - 1).abs().max()]).tolist()
    if not (low >= 0 and high <= 1 + tolerance and off <= tolerance):
        raise ValueError(f"the targets are floating but not class probabilities (entries from "
                         f"{low:.4g} to {high:.4g}, sums over the classes off 1 by up to "
                         f"{off:.3g}): cross-entropy (the default loss) reads floating targets "
                         "as probabilities; for real-valued targets pass loss='mse'")


def mean_squared_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error against a target of as many entries, cast and reshaped to the
    prediction's (integer class labels ``[B]`` for a ``[B, C]`` output are refused)."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"the mse target must be a tensor, got {type(target).__name__}")
    if (not target.is_floating_point() and prediction.dim() >= 1 and prediction.shape[-1] > 1
            and target.shape == prediction.shape[:-1]):
        raise ValueError(f"loss='mse' got integer class labels of shape {_shape(target)} for an "
                         f"output of shape {_shape(prediction)}: use loss='cross_entropy' (the "
                         "default) for class labels, or give real-valued targets of the "
                         "output's shape")
    if target.numel() != prediction.numel():
        raise ValueError(f"loss='mse' needs a target with as many entries as the model's output: "
                         f"output {_shape(prediction)}, target {_shape(target)} (do the inputs "
                         "and the targets hold the same number of examples?)")
    return F.mse_loss(prediction, target.to(prediction.dtype).reshape(prediction.shape))


def resolve_loss(loss: str | LossFunction | None) -> tuple[LossFunction, str, bool]:
    """``(function, readable name, takes logits)`` for a loss option."""
    if loss is None or loss == "cross_entropy":
        return cross_entropy, "cross_entropy", True
    if loss == "mse":
        return mean_squared_error, "mse", True
    if isinstance(loss, str):
        raise ValueError(f"loss must be one of {LOSS_NAMES} or a callable loss(output, target), "
                         f"got {loss!r}")
    if not callable(loss):
        raise TypeError(f"loss must be a callable loss(output, target), got "
                        f"{type(loss).__name__}")
    return loss, getattr(loss, "__name__", type(loss).__name__), False


def compute_loss(function: LossFunction, builtin: bool, output: Any, target: Any,
                 dtype: torch.dtype, batch: str = "the batch", check: bool = False
                 ) -> torch.Tensor:
    """``function(output, target)`` as a 0-dim tensor of ``dtype``; a ``builtin`` loss gets the
    logits in ``dtype``. Errors name ``batch``; ``check`` also checks the labels' values (one
    host sync: once per batch, never inside the ascent)."""
    logits = output_tensor(output)
    if logits is not None and not (logits.is_floating_point() or logits.is_complex()):
        raise TypeError(f"{batch}: the model returned a tensor of dtype "
                        f"{str(logits.dtype).removeprefix('torch.')} and shape {_shape(logits)}; "
                        "sharpness needs floating scores (logits), not integer predictions such "
                        "as an argmax")
    try:
        if builtin:
            if logits is None:
                raise TypeError(f"the model returned {type(output).__name__}, which has no logits "
                                "tensor; pass loss=callable(output, target)")
            if check and function is cross_entropy:
                check_class_labels(logits, target)
            value = function(logits.to(dtype), target)
        else:
            value = function(logits if logits is not None else output, target)
    except (TypeError, ValueError) as err:
        # name the batch in the plain TypeErrors and ValueErrors of the loss (subclasses, which
        # may take other arguments, pass unchanged)
        if type(err) not in (TypeError, ValueError) or str(err).startswith(batch):
            raise
        raise type(err)(f"{batch}: {err}") from err
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{batch}: the loss must return a tensor, got {type(value).__name__}")
    if value.numel() != 1:
        raise ValueError(f"{batch}: the loss must return a scalar, got shape "
                         f"{tuple(value.shape)}")
    if value.is_complex():
        # the cast to a real dtype would drop the imaginary part with only a warning: the
        # ascent would maximise the real part of whatever the loss computes
        raise TypeError(f"{batch}: the loss returned a complex tensor "
                        f"({str(value.dtype).removeprefix('torch.')}); it must be a real "
                        "floating scalar (take .real or .abs() in the loss if that is meant)")
    if not value.is_floating_point():
        raise TypeError(f"{batch}: the loss returned a tensor of dtype "
                        f"{str(value.dtype).removeprefix('torch.')}; it must be a floating "
                        "scalar that depends on the parameters")
    return value.reshape(()).to(dtype)
