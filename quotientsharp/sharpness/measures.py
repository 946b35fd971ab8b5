"""The sharpness measures of SPEC section 5, one batch at a time.

Every loss is evaluated functionally (:class:`FunctionalModel`): the model's own parameters and
buffers are never handed to its forward; clones taken once per call stand in for them, and
perturbed values are passed through :func:`torch.func.functional_call`.

- :class:`AverageMeasure`: ``L(theta + delta) - L(theta)``, ``delta ~ N(0, rho^2 diag(c^2))``;
- :class:`AscentMeasure`: Auto-PGD (:mod:`.solver`) over a geometry (:mod:`.geometry`): the
  worst case in an L2 ball (plain or adaptive, a :class:`~.geometry.ScaledBlock`) or an
  L-infinity box (:class:`~.geometry.BoxGeometry`), or geodesic sharpness over the product of
  GL buckets, diagonal block and other block;
- :class:`RelativeFlatness`: Petzka et al. 2021 for one layer, from Hessian-vector products.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .batches import Batch, LossFunction, compute_loss
from .geometry import (
    BoxGeometry,
    DiagonalBlock,
    GLBlock,
    ProductGeometry,
    ScaledBlock,
)
from .solver import AscentSettings, ascend

Tensors = tuple[torch.Tensor, ...]


def geometry_dtype(dtypes: Sequence[torch.dtype]) -> torch.dtype:
    """float64 if any parameter is float64, else float32 (half and bfloat16 models included)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


class FunctionalModel:
    """The loss of a model at given parameter values; the model's tensors are never used.

    Parameters
    ----------
    model
        The network (only read: its parameters are shared, never handed to the forward,
        and its buffers are cloned once).
    loss
        ``loss(output, target)`` and whether it is a built-in taking logits.
    """

    def __init__(self, model: nn.Module, loss: tuple[LossFunction, bool]) -> None:
        self.model = model
        self.loss_function, self.builtin_loss = loss
        named = dict(model.named_parameters())
        if not named:
            raise ValueError("the model has no parameters")
        self.dtypes = {n: p.dtype for n, p in named.items()}
        self.trainable = [n for n, p in named.items() if p.requires_grad]
        if not self.trainable:
            raise ValueError("the model has no trainable parameters (requires_grad=True)")
        for name, tensor in named.items():
            if not tensor.is_floating_point():
                raise TypeError(f"parameter {name!r} has non-floating dtype {tensor.dtype}")
        devices = {p.device for p in named.values()}
        if len(devices) != 1:
            raise ValueError("the model's parameters are on several devices "
                             f"{sorted(map(str, devices))}")
        self.device = devices.pop()
        # ``theta`` shares the model's storage and is only ever read by this package. The
        # forward never receives it: perturbed parameters are new tensors (base + xi) and the
        # ones passed unperturbed get a private clone (``_unperturbed``), so whatever the forward
        # does to its inputs the model's own tensors stay intact, without a copy of the model.
        self.theta = {n: p.detach() for n, p in named.items()}
        self._clones: dict[str, torch.Tensor] = {}
        self.buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        self.dtype = geometry_dtype([self.dtypes[n] for n in self.trainable])
        self.theta_geometry = {n: self.theta[n].to(self.dtype) for n in self.trainable}
        floating = {t.dtype for t in [*named.values(), *self.buffers.values()]
                    if t.is_floating_point()}
        self.input_dtype = floating.pop() if len(floating) == 1 else None

    def check_finite(self) -> None:
        """Raise naming every trainable parameter with NaN or inf entries (one host sync)."""
        flags = torch.stack([torch.isfinite(self.theta[n]).all() for n in self.trainable])
        bad = [n for n, ok in zip(self.trainable, flags.tolist(), strict=True) if not ok]
        if bad:
            raise ValueError(f"parameter(s) {bad} contain non-finite values (NaN or inf)")

    def _unperturbed(self, name: str) -> torch.Tensor:
        """A private copy of parameter ``name``, made the first time it is passed as is."""
        if name not in self._clones:
            self._clones[name] = self.theta[name].clone()
        return self._clones[name]

    def loss(self, batch: Batch, updates: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The loss with ``updates`` (by name, geometry dtype) replacing the parameters.

        ``updates`` must not alias the model's own tensors (``theta``): the forward receives
        them (cast to each parameter's dtype) and may write to its inputs.
        """
        params = {name: (updates[name].to(self.dtypes[name]) if name in updates
                         else self._unperturbed(name)) for name in self.theta}
        output = torch.func.functional_call(self.model, (params, self.buffers), batch.args,
                                            batch.kwargs)
        return compute_loss(self.loss_function, self.builtin_loss, output, batch.target,
                            self.dtype)

    def loss_and_gradients(self, batch: Batch
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
        """The loss at ``theta`` and its gradient per trainable parameter (geometry dtype).

        A parameter the loss does not depend on gets ``None``. The leaves are private copies
        of the parameters, so the forward may write to them without touching the model.
        """
        leaves = {n: self.theta_geometry[n].clone().requires_grad_(True) for n in self.trainable}
        with torch.enable_grad():
            loss = self.loss(batch, leaves)
            if not loss.requires_grad:
                return loss.detach(), dict.fromkeys(self.trainable)
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        return loss.detach(), dict(zip(leaves, grads, strict=True))

    def parameters_without_gradient(self, batch: Batch) -> list[str]:
        """Trainable parameters the loss on ``batch`` does not depend on (autograd ``None``)."""
        return [n for n, g in self.loss_and_gradients(batch)[1].items() if g is None]


def checked_clean_loss(loss: torch.Tensor, index: int) -> torch.Tensor:
    """``loss`` if finite, else a ``ValueError`` naming the batch (one host sync per batch)."""
    if not bool(torch.isfinite(loss)):
        raise ValueError(f"the clean loss on batch {index} is not finite ({float(loss)})")
    return loss


@dataclass
class FirstEvaluation:
    """The loss at ``theta`` and its gradient by parameter name, as the setup computed them.

    Reused by the first batch's measurement, so that the parameter check costs no extra
    forward+backward (``None`` gradients: parameters the loss does not depend on).
    """

    loss: torch.Tensor
    gradients: dict[str, torch.Tensor | None]


@dataclass
class BatchOutcome:
    """One batch: sharpness, clean and perturbed loss, norms, optional displacement."""

    value: torch.Tensor
    clean: torch.Tensor
    perturbed: torch.Tensor
    norms: dict[str, torch.Tensor]
    perturbation: dict[str, torch.Tensor] | None = None


# ---------------------------------------------------------------------------- coordinates
class PlainCoordinates:
    """Each perturbed parameter is its own coordinate tensor."""

    def __init__(self, model: FunctionalModel, names: Sequence[str]) -> None:
        self.names = list(names)
        self.base = tuple(model.theta_geometry[n] for n in self.names)

    def updates(self, point: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, point, strict=True))


class LayoutCoordinates:
    """Symmetry coordinates of a :class:`~quotientsharp.models.ParameterLayout`."""

    def __init__(self, model: FunctionalModel, layout: Any, excluded: set[str]) -> None:
        self.layout = layout
        self.coords = layout.to_coordinates(model.theta_geometry)
        self.gl = [tuple(pair) for pair in self.coords.gl]
        self.gl_pairs = list(self.coords.gl_pairs)
        self.diagonal = self.coords.diagonal
        self.other_names = [n for n in self.coords.other if n not in excluded]
        self._fixed_other = [n for n in self.coords.other if n in excluded]

    def blocks(self, metric: str, eps: float, exact_steps: int, other_scale: str,
               other_path: str) -> list:
        blocks: list = []
        for (G, H), pairs in zip(self.gl, self.gl_pairs, strict=True):
            names = [f"{p.module} {p.kind} head {p.head}" for p in pairs]
            blocks.append(GLBlock(G, H, metric, eps, exact_steps, names, name="gl"))
        if self.diagonal is not None:
            blocks.append(DiagonalBlock(*self.diagonal, metric=metric))
        if self.other_names:
            base = [self.coords.other[n] for n in self.other_names]
            blocks.append(ScaledBlock(base, other_scale, other_path))
        return blocks

    def updates(self, point: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        point = list(point)
        gl = [(point[2 * i], point[2 * i + 1]) for i in range(len(self.gl))]
        rest = point[2 * len(self.gl):]
        diagonal = None
        if self.diagonal is not None:
            diagonal, rest = (rest[0], rest[1]), rest[2:]
        other = dict(self.coords.other)
        other.update(zip(self.other_names, rest, strict=True))
        parameters = self.layout.to_parameters(self.coords.replace(gl=gl, diagonal=diagonal,
                                                                   other=other))
        # unperturbed other parameters would be the base tensors themselves: leave them to the
        # functional model, which passes a private copy
        for name in self._fixed_other:
            parameters.pop(name, None)
        return parameters


# ---------------------------------------------------------------------------- measures
def _scaled_norm(deltas: Sequence[torch.Tensor], scales: Sequence[torch.Tensor]) -> torch.Tensor:
    """``||delta / c||_2`` with ``c = 0`` coordinates (always ``delta = 0``) left out."""
    total = sum((torch.where(c == 0, torch.zeros_like(d), d / c.masked_fill(c == 0, 1.0)))
                .square().sum() for d, c in zip(deltas, scales, strict=True))
    return total.sqrt()


class AverageMeasure:
    """``E_delta[L(theta + delta)] - L(theta)``, ``delta ~ N(0, rho^2 diag(c^2))``.

    ``c = |theta|`` with ``adaptive``, else ``1``; ``samples`` draws per batch. The reported
    norm is the mean ``||delta / c||_2`` of the draws, the kept perturbation the last draw.
    """

    def __init__(self, model: FunctionalModel, rho: float, adaptive: bool, samples: int,
                 generator: torch.Generator) -> None:
        self.model, self.rho, self.adaptive, self.samples = model, rho, adaptive, samples
        self.generator = generator
        self.coordinates: PlainCoordinates | None = None

    def setup(self, excluded: Sequence[str]) -> None:
        warn_excluded(excluded, set())
        names = [n for n in self.model.trainable if n not in excluded]
        if not names:
            raise ValueError("no parameter is left to perturb")
        self.coordinates = PlainCoordinates(self.model, names)
        self.scales = tuple(w.abs() if self.adaptive else torch.ones_like(w)
                            for w in self.coordinates.base)

    def evaluations_per_batch(self) -> int:
        return self.samples

    def __call__(self, batch: Batch, index: int, tick, keep: bool,
                 first: FirstEvaluation | None = None) -> BatchOutcome:
        assert self.coordinates is not None
        if first is not None:
            clean = first.loss
        else:
            with torch.no_grad():
                clean = checked_clean_loss(self.model.loss(batch, {}), index)
        total = torch.zeros((), dtype=self.model.dtype, device=self.model.device)
        norm_sum = torch.zeros_like(total)
        for _ in range(self.samples):
            deltas = tuple(self.rho * c * torch.randn(c.shape, generator=self.generator,
                                                      dtype=c.dtype, device=c.device)
                           for c in self.scales)
            point = tuple(w + d for w, d in zip(self.coordinates.base, deltas, strict=True))
            with torch.no_grad():
                total = total + self.model.loss(batch, self.coordinates.updates(point))
            norm_sum = norm_sum + _scaled_norm(deltas, self.scales)
            tick()
        mean = total / self.samples
        perturbation = (dict(zip(self.coordinates.names, deltas, strict=True)) if keep else None)
        return BatchOutcome(mean - clean, clean, mean, {"total": norm_sum / self.samples},
                            perturbation)


class AscentMeasure:
    """Auto-PGD ascent in a geometry built once from ``theta`` (worst-case or geodesic).

    Parameters
    ----------
    model
        The functional model.
    settings
        Solver settings.
    generator
        Random starts.
    build
        ``excluded -> (geometry, coordinates)``: called once, after the first batch has told
        which parameters receive no gradient.
    """

    def __init__(self, model: FunctionalModel, settings: AscentSettings,
                 generator: torch.Generator, build) -> None:
        self.model, self.settings, self.generator = model, settings, generator
        self._build = build
        self.geometry: ProductGeometry | BoxGeometry | None = None
        self.coordinates: PlainCoordinates | LayoutCoordinates | None = None

    def setup(self, excluded: Sequence[str]) -> None:
        self.geometry, self.coordinates = self._build(set(excluded))
        covered = set()
        if isinstance(self.coordinates, LayoutCoordinates):
            covered = set(excluded) - set(self.coordinates.coords.other)
        warn_excluded(excluded, covered)
        self.geometry.validate()

    def evaluations_per_batch(self) -> int:
        return self.settings.runs * self.settings.evaluations_per_run

    def _objective(self, batch: Batch):
        geometry, coordinates, model = self.geometry, self.coordinates, self.model

        def objective(xi: Tensors) -> tuple[torch.Tensor, Tensors]:
            leaves = tuple(t.detach().requires_grad_(True) for t in xi)
            with torch.enable_grad():
                loss = model.loss(batch, coordinates.updates(geometry.point(leaves)))
                if loss.requires_grad:
                    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
                else:
                    grads = (None,) * len(leaves)
            grads = tuple(torch.zeros_like(leaf) if g is None else g
                          for leaf, g in zip(leaves, grads, strict=True))
            return loss.detach(), grads

        return objective

    def _gradient_from_parameters(self, gradients: Mapping[str, torch.Tensor | None]) -> Tensors:
        """The gradient in ``xi`` at ``xi = 0`` from the gradient in the parameters.

        The chain rule through the (cheap) map ``xi -> parameters``: one backward through the
        geometry's path and the layout, none through the model.
        """
        assert self.geometry is not None and self.coordinates is not None
        leaves = tuple(t.detach().requires_grad_(True) for t in self.geometry.zeros())
        with torch.enable_grad():
            moved = self.coordinates.updates(self.geometry.point(leaves))
            pairs = [(moved[n], g) for n, g in gradients.items()
                     if g is not None and n in moved and moved[n].requires_grad]
            grads = (torch.autograd.grad([t for t, _ in pairs], leaves,
                                         grad_outputs=[g for _, g in pairs], allow_unused=True)
                     if pairs else (None,) * len(leaves))
        return tuple(torch.zeros_like(leaf) if g is None else g
                     for leaf, g in zip(leaves, grads, strict=True))

    def __call__(self, batch: Batch, index: int, tick, keep: bool,
                 first: FirstEvaluation | None = None) -> BatchOutcome:
        assert self.geometry is not None and self.coordinates is not None
        objective = self._objective(batch)
        initial = None
        if self.settings.random_init:
            if first is not None:
                clean = first.loss
            else:
                with torch.no_grad():
                    clean = checked_clean_loss(self.model.loss(batch, {}), index)
        elif first is not None:
            # the solver's first evaluation is at xi = 0, i.e. at theta: it is the clean loss
            clean = first.loss
            initial = (first.loss, self._gradient_from_parameters(first.gradients))
        else:
            loss, grads = objective(self.geometry.zeros())
            clean = checked_clean_loss(loss, index)
            initial = (loss, grads)
        outcome = ascend(self.geometry, objective, self.settings, self.generator, tick,
                         initial=initial)
        norms = self.geometry.block_norms(outcome.xi)
        perturbation = None
        if keep:
            with torch.no_grad():
                moved = self.coordinates.updates(self.geometry.point(outcome.xi))
                perturbation = {n: t - self.model.theta_geometry[n] for n, t in moved.items()}
        return BatchOutcome(outcome.loss - clean, clean, outcome.loss, norms, perturbation)


def plain_builder(model: FunctionalModel, rho: float, p: float, adaptive: bool):
    """Builder of the worst-case geometry: L2 ball or L-infinity box, ``c = |theta|`` or 1."""

    def build(excluded: set[str]):
        names = [n for n in model.trainable if n not in excluded]
        if not names:
            raise ValueError("no parameter is left to perturb")
        coordinates = PlainCoordinates(model, names)
        if math.isinf(p):
            scale = [w.abs() if adaptive else torch.ones_like(w) for w in coordinates.base]
            return BoxGeometry(coordinates.base, scale, rho), coordinates
        block = ScaledBlock(coordinates.base, "adaptive" if adaptive else "euclidean", "line")
        return ProductGeometry([block], rho, order=1), coordinates

    return build


def geodesic_builder(model: FunctionalModel, rho: float, layout: Any | None, metric: str,
                     order: int | str, eps: float, exact_steps: int, other_metric: str,
                     other_path: str):
    """Builder of the geodesic geometry over a layout (``None``: every parameter is other)."""

    def build(excluded: set[str]):
        if layout is None:
            names = [n for n in model.trainable if n not in excluded]
            if not names:
                raise ValueError("no parameter is left to perturb")
            coordinates = PlainCoordinates(model, names)
            blocks = [ScaledBlock(coordinates.base, other_metric, other_path)]
        else:
            coordinates = LayoutCoordinates(model, layout, excluded)
            blocks = coordinates.blocks(metric, eps, exact_steps, other_metric, other_path)
        return ProductGeometry(blocks, rho, order=order), coordinates

    return build


# ---------------------------------------------------------------------------- relative flatness
def default_layer(model: nn.Module) -> str:
    """Name of the last ``nn.Linear`` (in ``named_modules`` order) with a trainable weight."""
    found = [name for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and module.weight.requires_grad]
    if not found:
        raise ValueError("the model has no trainable nn.Linear layer: pass layer='module name'")
    return found[-1]


def layer_weight_name(model: nn.Module, layer: str) -> str:
    """The ``named_parameters`` name of ``layer``'s weight."""
    modules = dict(model.named_modules())
    if layer not in modules:
        raise ValueError(f"layer {layer!r} is not a module of the model")
    weight = getattr(modules[layer], "weight", None)
    if not isinstance(weight, nn.Parameter):
        raise ValueError(f"layer {layer!r} has no weight parameter")
    for name, tensor in model.named_parameters():
        if tensor is weight:
            if not tensor.requires_grad:
                raise ValueError(f"the weight of layer {layer!r} is frozen")
            if tensor.dim() < 2:
                raise ValueError(f"the weight of layer {layer!r} has shape "
                                 f"{tuple(tensor.shape)}; relative flatness needs rows w_s")
            return name
    raise ValueError(f"the weight of layer {layer!r} is not among the model's parameters")


class RelativeFlatness:
    """``kappa = sum_{s,s'} <w_s, w_s'> Tr(H_{s,s'})`` for the rows ``w_s`` of one layer.

    With ``W W^T = sum_r lambda_r q_r q_r^T`` and ``H_k`` the Hessian block of column ``k``,
    ``kappa = sum_k Tr(W W^T H_k) = sum_{r,k} lambda_r (q_r e_k^T) : H (q_r e_k^T)``: one
    Hessian-vector product per nonzero eigenvalue and input feature, batched ``chunk`` at a time
    (double backward; attention runs the math SDPA kernel, which supports it). The Hessian is
    never formed.
    """

    def __init__(self, model: FunctionalModel, weight_name: str, chunk: int) -> None:
        self.model, self.weight_name, self.chunk = model, weight_name, chunk
        weight = model.theta_geometry[weight_name]
        self.rows = weight.reshape(weight.shape[0], -1)
        values, vectors = torch.linalg.eigh(self.rows @ self.rows.mT)
        rank = min(self.rows.shape)
        self.values, self.vectors = values[-rank:], vectors[:, -rank:]   # [r], [out, r]

    def setup(self, excluded: Sequence[str]) -> None:
        if self.weight_name in excluded:
            raise ValueError(f"parameter {self.weight_name!r} receives no gradient")

    def evaluations_per_batch(self) -> int:
        return 1

    def _directions(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.rows.shape[1]
        index = torch.arange(start, stop, device=self.rows.device)
        r, k = index // features, index % features
        directions = torch.zeros(stop - start, *self.rows.shape, dtype=self.rows.dtype,
                                 device=self.rows.device)
        chunk = torch.arange(stop - start, device=self.rows.device)
        directions[chunk, :, k] = self.vectors[:, r].mT
        return directions, self.values[r]

    def __call__(self, batch: Batch, index: int, tick, keep: bool,
                 first: FirstEvaluation | None = None) -> BatchOutcome:
        shape = self.model.theta_geometry[self.weight_name].shape
        weight = self.rows.detach().clone().requires_grad_(True)
        total = torch.zeros((), dtype=self.rows.dtype, device=self.rows.device)
        count = self.values.numel() * self.rows.shape[1]
        with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
            loss = self.model.loss(batch, {self.weight_name: weight.reshape(shape)})
            clean = first.loss if first is not None else checked_clean_loss(loss.detach(), index)
            (grad,) = torch.autograd.grad(loss, weight, create_graph=True)
            if grad.requires_grad:
                for start in range(0, count, self.chunk):
                    stop = min(start + self.chunk, count)
                    directions, weights = self._directions(start, stop)
                    products = self._hvp(grad, weight, directions)
                    total = total + (weights * (directions * products).sum((-2, -1))).sum()
        tick()
        return BatchOutcome(total.detach(), clean, clean, {})

    @staticmethod
    def _hvp(grad: torch.Tensor, weight: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
        try:
            (products,) = torch.autograd.grad(grad, weight, grad_outputs=directions,
                                              is_grads_batched=True, retain_graph=True)
            return products
        except RuntimeError:
            # some operators have no batching rule for their double backward: one at a time
            return torch.stack([torch.autograd.grad(grad, weight, grad_outputs=d,
                                                    retain_graph=True)[0] for d in directions])


def warn_excluded(names: Sequence[str], covered: set[str]) -> None:
    """Warn about parameters without gradient: excluded, or (if in a symmetry) only noted."""
    dropped = [n for n in names if n not in covered]
    kept = [n for n in names if n in covered]
    if dropped:
        warnings.warn(f"parameter(s) {dropped} receive no gradient from the loss: excluded from "
                      "the perturbation (kept fixed)", UserWarning, stacklevel=4)
    if kept:
        warnings.warn(f"parameter(s) {kept} receive no gradient from the loss but belong to a "
                      "symmetry pair: they stay in the geometry with a zero gradient",
                      UserWarning, stacklevel=4)
