"""Discovery/layout stage: the ``symmetries`` option of a geodesic measurement, as ``None``,
a :class:`~quotientsharp.models.ParameterLayout` or a list of
:class:`~quotientsharp.models.QuotientBinding` (:func:`symmetry_layout`); the caller's own
bindings are checked on the first batch (:func:`check_user_bindings`).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from quotientsharp.core.quotient import declares_invariant
from quotientsharp.core.scalars import SEED_LIMIT
from quotientsharp.core.validation import warn_at_caller
from quotientsharp.engine.batches import Batch, compute_loss, few_names, output_tensor
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.models.binding import QuotientBinding, check_binding_list
from quotientsharp.models.report import NoSymmetryWarning, UnboundSymmetryWarning
from quotientsharp.models.symmetry_check import (
    SymmetryCheckError,
    check_bindings,
    check_structure,
    group_scale,
    relative_change,
    symmetry_tolerance,
)


def no_symmetry_note(other_metric: str = "adaptive", other_path: str = "line") -> str:
    """What geodesic sharpness equals on a model without symmetry, where every parameter is in
    the other factor (its ``other_metric`` and ``other_path``; a curved path needs an order
    above 1, ``GeodesicSpec`` refuses it at order 1), and what to do."""
    if other_metric == "euclidean":
        same = ("geodesic sharpness equals worst-case sharpness (p=2) here (every parameter is in "
                "the other factor, with other_metric='euclidean')")
    elif other_path == "geodesic":
        same = ("every parameter is in the adaptive factor, moved along its geodesic "
                "(other_path='geodesic'): adaptive sharpness's ball on another path, with no "
                "symmetry quotiented out")
    else:
        same = ("geodesic sharpness equals adaptive sharpness here (every parameter is in the "
                "adaptive factor)")
    return (f"no symmetry was found or bound, so {same}; to measure a symmetry discovery does "
            "not know, bind its quotient: symmetries=QuotientBinding(...) in the API, --symmetry "
            "MODULE:FUNCTION on the command line, a 'symmetry' field in a study manifest "
            "(docs/tutorial-custom-symmetry.md)")


#: Why geodesic sharpness equals adaptive sharpness on a model without symmetry, and what to do
#: (the note of the default options, which ``measure`` and ``study`` always use).
NO_SYMMETRY_NOTE = no_symmetry_note()


#: What the ``symmetries`` option may be, in the words of its errors.
SYMMETRIES_ALLOWED = ("'auto', 'none', a SymmetryReport, a ParameterLayout or one or a list of "
                      "QuotientBinding")


def _is_layout(symmetries: object) -> bool:
    """Whether ``symmetries`` is a layout (it maps parameters to coordinates and back)."""
    return hasattr(symmetries, "to_coordinates") and hasattr(symmetries, "to_parameters")


def check_symmetries(symmetries: object) -> None:
    """Raise unless ``symmetries`` is one of :data:`SYMMETRIES_ALLOWED`: a ``ValueError`` for
    another string, a ``TypeError`` for another type or a list of anything but bindings."""
    from quotientsharp.models import SymmetryReport
    if isinstance(symmetries, str):
        if symmetries not in ("auto", "none"):
            raise ValueError(f"symmetries must be {SYMMETRIES_ALLOWED}, got {symmetries!r}")
    elif isinstance(symmetries, (list, tuple)):
        check_binding_list(symmetries)
    elif not (isinstance(symmetries, (QuotientBinding, SymmetryReport))
              or _is_layout(symmetries)):
        raise TypeError(f"symmetries must be {SYMMETRIES_ALLOWED}, got "
                        f"{type(symmetries).__name__} {symmetries!r}")


def check_diagonal(diagonal: object) -> None:
    """Raise a ``TypeError`` unless ``diagonal`` is ``None`` or a list of ``(u_name, v_name)``
    pairs of parameter names (whether the model has them is checked by discovery)."""
    if diagonal is None:
        return
    if isinstance(diagonal, (list, tuple)) and all(
            isinstance(pair, (list, tuple)) and len(pair) == 2
            and all(isinstance(name, str) for name in pair) for pair in diagonal):
        return
    raise TypeError(f"diagonal must be None or a list of (u_name, v_name) pairs of parameter "
                    f"names, got {diagonal!r}")


def symmetry_layout(model: nn.Module, functional: FunctionalModel, symmetries: Any,
                    diagonal: Any, note: str = NO_SYMMETRY_NOTE
                    ) -> tuple[Any | None, dict[str, Any]]:
    """The symmetry layout (``None``, a layout or a list of bindings) and a settings summary
    (``symmetries`` was checked by :func:`check_symmetries` when the measure was made);
    ``note``: the warning where discovery finds no symmetry (:func:`no_symmetry_note`)."""
    bindings = user_bindings(symmetries)
    if bindings:
        _warn_unbound(model, bindings)
        return bindings, {"symmetries": "bindings", "symmetry_found": True,
                          # "invariant": False where the class opts out of the check that
                          # its metric is invariant (its values then depend on the group)
                          "bindings": [{"name": b.name, "quotient": b.quotient.name,
                                        "parameters": list(b.parameters),
                                        "invariant": declares_invariant(b.quotient)}
                                       for b in bindings]}
    if symmetries == "none":
        return None, {"symmetries": "none", "symmetry_found": False}
    if _is_layout(symmetries):
        return symmetries, {"symmetries": type(symmetries).__name__, "symmetry_found": True}
    if symmetries == "auto":
        from quotientsharp.models import find_symmetries
        report = find_symmetries(model, diagonal=diagonal)
    else:
        report = symmetries
        _check_report_fits(report, model, functional)
    from quotientsharp.models import ParameterLayout
    if report.unknown:
        warn_at_caller(f"attention-like module(s) {report.unknown} were not understood: their "
                       "parameters are measured with the adaptive geometry", UserWarning)
    layout = ParameterLayout(report, functional.theta_geometry)
    if not report.pairs and not report.diagonal:
        warn_at_caller(note, NoSymmetryWarning)
    summary = {"symmetries": "report", "symmetry_found": bool(report.pairs or report.diagonal),
               "gl_pairs": len(report.pairs),
               "gl_buckets": [list(shape) for shape in layout.bucket_shapes],
               "diagonal_pairs": len(report.diagonal), "unknown_modules": list(report.unknown)}
    return layout, summary


def _warn_unbound(model: nn.Module, bindings: Sequence[QuotientBinding]) -> None:
    """An :class:`UnboundSymmetryWarning` where discovery finds symmetries in parameters that
    none of ``bindings`` holds (bindings turn discovery off)."""
    from quotientsharp.models import find_symmetries

    with warnings.catch_warnings():
        # its notes (no symmetry, a degenerate adapter) are about a layout not used here
        warnings.simplefilter("ignore")
        try:
            report = find_symmetries(model)
        except (ValueError, TypeError, RuntimeError):
            return      # a structure discovery cannot read: nothing to say of it here
    bound = {name for binding in bindings for name in binding.parameters}
    unbound = [name for name in (*report.pair_parameters, *report.diagonal_parameters)
               if name not in bound]
    if unbound:
        warn_at_caller(f"symmetries: with bindings given, discovery is off, and the symmetries it "
                       f"finds in {len(unbound)} other parameter(s) ({few_names(unbound)}) are "
                       "measured with the adaptive geometry, not on their quotient. Bind them "
                       "too (find_symmetries(model) lists them), or filter "
                       "UnboundSymmetryWarning where that is meant", UnboundSymmetryWarning)


def _check_report_fits(report: Any, model: nn.Module, functional: FunctionalModel) -> None:
    """Raise a ``ValueError`` naming ``symmetries`` when the report was made for another model
    (parameters it names that the model lacks or has in other shapes, parameters of the model
    it does not know), or while other parameters were frozen."""
    shapes = {name: tuple(t.shape) for name, t in functional.theta.items()}
    known = dict(getattr(report, "parameter_shapes", {}))
    missing = [n for n in known if n not in shapes]
    differ = [f"{n} {tuple(known[n])} (the model's {shapes[n]})" for n in known
              if n in shapes and tuple(known[n]) != shapes[n]]
    unknown = [n for n in shapes if n not in known]
    problems = [f"{what} {few_names(names)}{tail}" for what, names, tail in (
        ("this model has no parameter(s)", missing, ""), ("the shapes of", differ, " differ"),
        ("it does not know the model's parameter(s)", unknown, "")) if names]
    if problems:
        made = getattr(report, "model_type", "") or "unnamed"
        raise ValueError(f"symmetries: the SymmetryReport belongs to another model (made for "
                         f"class {made}, this model's class is {type(model).__name__}): "
                         + "; ".join(problems) + ". Pass find_symmetries(model) of this model, "
                         "or symmetries='auto'")
    changed = sorted(set(getattr(report, "trainable", [])) ^ set(functional.trainable))
    if changed:
        raise ValueError(f"symmetries: the SymmetryReport was made before requires_grad "
                         f"changed on parameter(s) {few_names(changed)}: make it again "
                         "(find_symmetries(model)), or pass symmetries='auto'")


def user_bindings(symmetries: object) -> list[QuotientBinding]:
    """The caller's bindings in the ``symmetries`` option (empty for discovery or a layout)."""
    if isinstance(symmetries, QuotientBinding):
        return [symmetries]
    if isinstance(symmetries, (list, tuple)):
        return [b for b in symmetries if isinstance(b, QuotientBinding)]
    return []


Evaluate = Callable[[Mapping[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor | None]]


def _evaluator(functional: FunctionalModel, batch: Batch,
               outputs: Callable[[Any], torch.Tensor | None] = output_tensor) -> Evaluate:
    """The loss and outputs (``outputs`` of the model's output) on ``batch`` with some
    parameters replaced (each passed in its own dtype, as a new tensor: never theta itself)."""

    def evaluate(values: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor,
                                                              torch.Tensor | None]:
        full = {n: values[n].to(functional.dtypes[n]) if n in values
                else functional.theta[n].clone() for n in functional.theta}
        output = torch.func.functional_call(functional.model, (full, functional.buffers),
                                            batch.args, batch.kwargs)
        loss = compute_loss(functional.loss_function, functional.builtin_loss, output,
                            batch.target, functional.dtype, batch.label)
        return loss, outputs(output)

    return evaluate


def _main_output(output: Any) -> torch.Tensor | None:
    """The outputs a discovered symmetry must leave unchanged beside the loss: the logits
    (:func:`output_tensor`), else the first floating tensor of a model output (the
    ``last_hidden_state`` of a model without a head, ``shape=[batch, T, d]``).

    The loss alone is one number, whose change under a false symmetry's element can cancel to
    below the tolerance (SpeechT5's encoder: ``1e-2`` for one element, ``3e-4`` for the next).
    """
    logits = output_tensor(output)
    if logits is not None or not isinstance(output, Mapping):
        return logits
    return next((value for value in output.values()
                 if isinstance(value, torch.Tensor) and value.is_floating_point()), None)


def _tensors(value: object) -> Iterator[torch.Tensor]:
    """The tensors in ``value``, a tensor or nested lists, tuples and dicts of them (a model
    output is a dict)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)


class _PrecisionTrace(TorchFunctionMode):
    """The floating dtypes of the values a forward computes from ``sources`` (the parameters
    a group element moves), in :attr:`dtypes`.

    Only these values differ between the forward at theta and at a group element's point, so
    only their rounding separates the two; a model can round them coarser than its parameters
    (GPT-J, ESM and Cohere cast queries and keys to float32 in a float64 model), while its
    own position tables, rounded alike in both forwards, do not count. A derived tensor is
    known by identity (a weak reference: a freed tensor's ``id`` may be reused).
    """

    def __init__(self, sources: Iterable[torch.Tensor]) -> None:
        super().__init__()
        self._derived: dict[int, weakref.ref[torch.Tensor]] = {}
        self.dtypes: set[torch.dtype] = set()
        for source in sources:
            self._mark(source)

    def _mark(self, value: torch.Tensor) -> None:
        self._derived[id(value)] = weakref.ref(value)
        if value.is_floating_point() or value.is_complex():
            self.dtypes.add(value.dtype)

    def _is_derived(self, value: torch.Tensor) -> bool:
        known = self._derived.get(id(value))
        return known is not None and known() is value

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if any(self._is_derived(t) for t in _tensors((args, kwargs or {}))):
            for tensor in _tensors(result):
                self._mark(tensor)
        return result


def _computing_dtype(evaluate: Evaluate, values: Mapping[str, torch.Tensor],
                     moving: Iterable[str]) -> tuple[torch.dtype, tuple[torch.Tensor,
                                                                        torch.Tensor | None]]:
    """The least precise dtype (largest ``eps``) of the values computed from the parameters
    named in ``moving`` (the parameters' own included) by the forward at ``values``, and that
    forward's loss and outputs (bit-identical to it run untraced)."""
    trace = _PrecisionTrace(values[n] for n in moving)
    with trace:
        reference = evaluate(values)
    return max(trace.dtypes, key=lambda d: torch.finfo(d).eps), reference


def check_user_bindings(functional: FunctionalModel, batch: Batch,
                        bindings: Sequence[QuotientBinding], invariance: bool, seed: int
                        ) -> None:
    """Raise a :class:`~quotientsharp.models.SymmetryCheckError` naming the first binding that
    fails (the model must be in the mode it is measured in: eval)."""
    params = functional.theta_geometry
    for binding in bindings:
        check_structure(binding, params)
    if not invariance:
        return
    evaluate = _evaluator(functional, batch)
    with torch.no_grad():
        forward_dtype, _ = _computing_dtype(evaluate, params,
                                            {n for b in bindings for n in b.parameters})
    for result in check_bindings(bindings, params, evaluate, forward_dtype, seed=seed):
        if not result.passed:
            raise SymmetryCheckError(
                f"{result.message()}: the quotient's group changes the model's function, so "
                "geodesic sharpness would measure a space that is not the model's symmetry "
                "quotient. Check the binding's parameters and maps, and that the model is "
                "invariant in eval mode (sharpness() measures in eval mode); in the API, "
                "check_symmetry=False skips this check")


#: What selects the pairs a group element moves: an attention pair, or the string ``"diagonal"``
#: for the diagonal coordinates.
Selection = Callable[[Any], bool]


def check_discovered(functional: FunctionalModel, batch: Batch, coordinates: Any,
                     seed: int) -> None:
    """Raise a :class:`~quotientsharp.models.SymmetryCheckError` where the discovered
    symmetries (``coordinates``, a :class:`~.coordinates.LayoutCoordinates`) are not symmetries
    of the model on ``batch`` (batch 0, in eval mode), naming the kind and the modules whose
    pairs fail.

    Discovery reads the model's structure, not its function: an attention that normalises its
    queries, adds a position term computed from its queries or gates its values can look like a
    plain one and have its pairs reported, though their group changes the function. Each such
    architecture found is recognised; one not yet seen would be measured on a space that is not
    its symmetry quotient, silently. So one random element of every pair's group at once
    (condition near ``e^2``: :func:`~quotientsharp.models.symmetry_check.group_scale`; a
    generator of its own, seeded with ``seed``, so that the measurement's draws are unchanged)
    must leave the loss and the outputs (the logits, or a headless model's first output:
    :func:`_main_output`) unchanged to ``sqrt(eps)`` of the coarsest dtype the
    forward computes the moved parameters' values in (:class:`_PrecisionTrace`): two forwards.
    Only where it does not are the kinds, then the modules of a failing kind, moved alone, to
    name them. Float32 and float64 forwards only: in half precision the rounding of a true
    symmetry reaches the changes of a false one.
    """
    factors = coordinates.factors()
    elements = _group_elements(factors, seed)
    if not elements:
        return
    unchanged = coordinates.updates(tuple(t for factor in factors for t in factor.base))
    moving = [n for n in unchanged if n not in coordinates.coords.other]
    if any(torch.finfo(functional.dtypes[n]).eps > torch.finfo(torch.float32).eps
           for n in moving):
        # in half precision the rounding of a true symmetry's element through a real model's
        # forward (10-15 % of the outputs on a 4-layer bfloat16 BERT) reaches the changes of a
        # false one (8-150 %): the check could not tell them apart
        return
    evaluate = _evaluator(functional, batch, _main_output)
    with torch.no_grad():
        # the tolerance follows the forward's own rounding of what the element moves, which
        # can be coarser than the parameters' dtype
        forward_dtype, reference = _computing_dtype(evaluate, unchanged, moving)
        if torch.finfo(forward_dtype).eps > torch.finfo(torch.float32).eps:
            return
        tolerance = symmetry_tolerance(forward_dtype)

        def change(selected: Selection, drawn: Mapping[int, torch.Tensor] = elements) -> float:
            moved = _moved_point(factors, coordinates.gl_pairs, drawn, selected)
            loss, outputs = evaluate(coordinates.updates(moved))
            return max(relative_change(loss, reference[0]),
                       0.0 if outputs is None or reference[1] is None
                       else relative_change(outputs, reference[1]))

        # a second, independent element must fail too: under a true symmetry, rounding can
        # flip a discrete choice of the forward (an expert router's, at a near tie), once
        if (change(lambda pair: True) <= tolerance
                or change(lambda pair: True,
                          _group_elements(factors, seed + len(factors))) <= tolerance):
            return
        failures = _failing_pairs(coordinates.gl_pairs, coordinates.diagonal is not None,
                                  change, tolerance)
    raise SymmetryCheckError(
        "discovered symmetries that are not symmetries of this model on batch 0: "
        f"{'; '.join(failures) or 'the pairs together, not any kind alone'} (the largest "
        "relative change of the loss and outputs under a random element of their group, "
        f"against a tolerance of {tolerance:.2g}). Discovery reads the model's structure, and "
        "this attention computes something it does not know, so geodesic sharpness would "
        "measure a space that is not the model's symmetry quotient. Measure with "
        "symmetries='none' (every parameter in the adaptive factor), bind the pairs that do "
        "hold with QuotientBinding (docs/tutorial-custom-symmetry.md), or pass "
        "check_symmetry=False to measure anyway")


def _group_elements(factors: Sequence[Any], seed: int) -> dict[int, torch.Tensor]:
    """One random element of the group of each symmetric factor (the buckets of pairs, the
    diagonal pairs), by position, moderately conditioned; a generator per factor, seeded from
    ``seed``."""
    return {index: factor.quotient.random_group_element(
                factor.base, scale=group_scale(factor.quotient, factor.base),
                generator=torch.Generator(device=factor.base[0].device).manual_seed(
                    (seed + index) % SEED_LIMIT))
            for index, factor in enumerate(factors) if factor.name in ("gl", "diagonal")}


def _moved_point(factors: Sequence[Any], gl_pairs: Sequence[Sequence[Any]],
                 elements: Mapping[int, torch.Tensor], selected: Selection
                 ) -> tuple[torch.Tensor, ...]:
    """The product's point with the group ``elements`` (one per bucket of pairs, one for the
    diagonal factor) applied where ``selected`` accepts the pair (the identity elsewhere)."""
    point: list[torch.Tensor] = []
    for index, factor in enumerate(factors):
        element = elements.get(index)
        if element is not None and index < len(gl_pairs):
            chosen = torch.tensor([selected(p) for p in gl_pairs[index]], device=element.device)
            identity = torch.eye(element.shape[-1], dtype=element.dtype, device=element.device)
            element = torch.where(chosen[:, None, None], element, identity)
        elif element is not None and not selected("diagonal"):
            element = None
        point.extend(factor.base if element is None
                     else factor.quotient.act(factor.base, element))
    return tuple(point)


def _failing_pairs(gl_pairs: Sequence[Sequence[Any]], diagonal: bool,
                   change: Callable[[Selection], float], tolerance: float) -> list[str]:
    """The kinds (``qk``, ``vo``, ``lora``, diagonal) whose group alone changes the function,
    each with the modules whose pairs do (at most four named, with their changes)."""
    failures = []
    if diagonal:
        moved = change(lambda pair: pair == "diagonal")
        if moved > tolerance:
            failures.append(f"the diagonal pairs (changed by {moved:.3g})")
    for kind in sorted({p.kind for bucket in gl_pairs for p in bucket}):
        if change(_pairs_of(kind)) <= tolerance:
            continue
        bad = {}
        for module in sorted({p.module for bucket in gl_pairs for p in bucket if p.kind == kind}):
            moved = change(_pairs_of(kind, module))
            if moved > tolerance:
                bad[module] = moved
        shown = ", ".join(f"{module} (changed by {moved:.3g})"
                          for module, moved in list(bad.items())[:4])
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        failures.append(f"the {kind} pairs of {shown or 'its modules together'}{more}")
    return failures


def _pairs_of(kind: str, module: str | None = None) -> Selection:
    """The selection of the attention pairs of ``kind`` (of ``module`` only, if given)."""
    def selected(pair: Any) -> bool:
        return (pair != "diagonal" and pair.kind == kind
                and (module is None or pair.module == module))

    return selected
