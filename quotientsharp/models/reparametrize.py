"""Move a network along its symmetry orbit: same function, different parameters.

Each pair gets ``(G A^{-1}, H A^T)`` with its own random ``A = scale * N`` (``N`` Gaussian, in
the pair's group: ``GL(h)``, ``GL(r)`` for a LoRA adapter, or for a rotary query/key pair a
complex scalar per rotation plane and a block on the other dimensions); each diagonal
coordinate gets ``(c u, v / c)``. Euclidean sharpness changes, the function does not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from quotientsharp.core.gl import rotary_planes
from quotientsharp.models.layout import ParameterLayout
from quotientsharp.models.report import RotarySpec, SymmetryReport

#: Resample a Gaussian factor whose 2-norm condition number exceeds this.
MAX_CONDITION = 1e6
#: Resample a diagonal factor smaller than this in magnitude (the 1-D analogue of conditioning).
MIN_DIAGONAL_FACTOR = 1e-3
_MAX_RESAMPLES = 100


def _compute_dtype(device: torch.device) -> torch.dtype:
    # float64 keeps the round-off of the transformation far below the parameters' own precision
    return torch.float32 if device.type == "mps" else torch.float64


def _gaussian_elements(count: int, size: int, rotary: RotarySpec | None,
                       generator: torch.Generator | None) -> torch.Tensor:
    """``count`` Gaussian elements of ``GL(size)`` or of its rotary subgroup, float64 on the CPU."""
    # drawn on the CPU whatever torch's default device: the same draws on every machine
    if rotary is None:
        return torch.randn(count, size, size, generator=generator, dtype=torch.float64,
                           device="cpu")
    rotary_dims, layout = rotary
    planes = torch.tensor(rotary_planes(size, rotary_dims, layout), dtype=torch.long,
                          device="cpu").reshape(-1, 2)
    first, second = planes[:, 0], planes[:, 1]
    real, imaginary = torch.randn(2, count, len(planes), generator=generator,
                                  dtype=torch.float64, device="cpu")
    elements = torch.zeros(count, size, size, dtype=torch.float64, device="cpu")
    elements[:, first, first] = real
    elements[:, second, second] = real
    elements[:, second, first] = imaginary
    elements[:, first, second] = -imaginary
    rest = size - rotary_dims
    elements[:, rotary_dims:, rotary_dims:] = torch.randn(count, rest, rest, generator=generator,
                                                          dtype=torch.float64, device="cpu")
    return elements


def _sample_matrices(count: int, size: int, generator: torch.Generator | None,
                     max_condition: float, rotary: RotarySpec | None = None) -> torch.Tensor:
    """``count`` Gaussian ``size x size`` elements of ``GL(size)`` (or of its ``rotary``
    subgroup) with condition number at most ``max_condition``."""
    matrices = _gaussian_elements(count, size, rotary, generator)
    for _ in range(_MAX_RESAMPLES):
        bad = torch.linalg.cond(matrices) > max_condition
        if not bool(bad.any()):
            return matrices
        matrices[bad] = _gaussian_elements(int(bad.sum()), size, rotary, generator)
    raise RuntimeError(f"could not draw {size}x{size} Gaussian matrices with condition number "
                       f"below {max_condition:g}")


def _parameters_of(model_or_params: object) -> dict[str, torch.Tensor]:
    """A new dict of the module's ``named_parameters()`` (frozen included), or of the dict."""
    if isinstance(model_or_params, nn.Module):
        return dict(model_or_params.named_parameters())
    if isinstance(model_or_params, Mapping):
        return dict(model_or_params)
    raise TypeError("model_or_params must be a torch.nn.Module or a dict of tensors, got "
                    f"{type(model_or_params).__name__}")


def _check_scale(scale: object) -> float:
    """``scale`` as a finite nonzero float."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale == 0.0:
        raise ValueError(f"scale must be finite and nonzero, got {scale}")
    return scale


def _move_bucket(g_factor: torch.Tensor, h_factor: torch.Tensor, applied: list[bool],
                 rotary: RotarySpec | None, scale: float, generator: torch.Generator | None,
                 max_condition: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(G A^{-1}, H A^T, A)`` for one bucket (``G`` ``shape=[P, n, h]``, ``H`` ``[P, m, h]``),
    ``A`` (float64, CPU) ``scale`` times a random group element where ``applied``, the identity
    elsewhere (drawn for every pair all the same)."""
    count, size = g_factor.shape[0], g_factor.shape[-1]
    matrices = scale * _sample_matrices(count, size, generator, max_condition, rotary)
    applied_mask = torch.tensor(applied, device="cpu")
    identity = torch.eye(size, dtype=torch.float64, device="cpu").expand(count, size, size)
    matrices = torch.where(applied_mask[:, None, None], matrices, identity)
    dtype = _compute_dtype(g_factor.device)
    on_device = matrices.to(device=g_factor.device, dtype=dtype)
    # G A^{-1}: solve X A = G rather than forming the inverse
    new_g = torch.linalg.solve(on_device, g_factor.to(dtype), left=False)
    new_h = h_factor.to(dtype) @ on_device.mT
    return new_g.to(g_factor.dtype), new_h.to(h_factor.dtype), matrices


def _move_diagonal(diagonal: Sequence[torch.Tensor], scale: float,
                   generator: torch.Generator | None, applied: bool
                   ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``((u c, v / c), c)`` for the diagonal coordinates ``(u, v)``, ``shape=[D]``: ``c`` is
    ``scale`` times Gaussian draws at least :data:`MIN_DIAGONAL_FACTOR` in size (float64, CPU),
    or ones if not ``applied`` (drawn all the same)."""
    u, v = diagonal
    draws = torch.randn(u.shape[0], generator=generator, dtype=torch.float64, device="cpu")
    for _ in range(_MAX_RESAMPLES):
        small = draws.abs() < MIN_DIAGONAL_FACTOR
        if not bool(small.any()):
            break
        draws[small] = torch.randn(int(small.sum()), generator=generator,
                                   dtype=torch.float64, device="cpu")
    diagonal_factors = scale * draws
    if not applied:
        diagonal_factors = torch.ones_like(diagonal_factors)
    dtype = _compute_dtype(u.device)
    factors = diagonal_factors.to(device=u.device, dtype=dtype)
    new_u = (u.to(dtype) * factors).to(u.dtype)
    new_v = (v.to(dtype) / factors).to(v.dtype)
    return (new_u, new_v), diagonal_factors


def reparametrize(model_or_params: nn.Module | Mapping[str, torch.Tensor],
                  report: SymmetryReport, scale: float = 1.0,
                  generator: torch.Generator | None = None,
                  kinds: Sequence[str] = ("qk", "vo", "lora", "diagonal"),
                  return_transforms: bool = False,
                  max_condition: float = MAX_CONDITION,
                  ) -> (dict[str, torch.Tensor]
                        | tuple[dict[str, torch.Tensor],
                                tuple[list[torch.Tensor], torch.Tensor | None]]):
    """Apply a random symmetry to every pair; the network's function is unchanged.

    Parameters
    ----------
    model_or_params
        A module (its ``named_parameters()``, frozen included, are used) or a parameter dict.
        Never modified.
    report
        From :func:`~quotientsharp.models.find_symmetries` on the same model.
    scale
        ``A = scale * N`` per pair; a large or small ``scale`` makes factors very unbalanced.
    generator
        A CPU ``torch.Generator`` for reproducible draws.
    kinds
        Which symmetries to apply: any of ``"qk"``, ``"vo"``, ``"lora"`` (LoRA adapters:
        ``(A, B) -> (M A, B M^{-1})``), ``"diagonal"``.
    return_transforms
        Also return, per bucket, ``A`` ``shape=[P, h, h]`` (float64, CPU; identity for kinds not
        applied; in the rotary subgroup for rotary buckets), and the diagonal factor ``c``
        ``shape=[D]`` (or ``None``).
    max_condition
        Gaussian ``N`` with a larger condition number are redrawn.

    Returns
    -------
    dict[str, Tensor]
        A new dict with every entry of the input; the transformed parameters are new detached
        tensors of the original dtype and device, the others are the input tensors.
        With ``return_transforms``: ``(params, (bucket_matrices, diagonal_factors))``.
    """
    params = _parameters_of(model_or_params)
    scale = _check_scale(scale)
    unknown_kinds = set(kinds) - {"qk", "vo", "lora", "diagonal"}
    if unknown_kinds:
        raise ValueError(f"kinds must be among 'qk', 'vo', 'lora', 'diagonal', got "
                         f"{sorted(unknown_kinds)}")
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU generator, got one on {generator.device}")
    if not max_condition > 1:
        raise ValueError(f"max_condition must be > 1, got {max_condition}")

    layout = ParameterLayout(report, params)
    with torch.no_grad():
        coords = layout.to_coordinates(params)
        new_gl = []
        matrices_per_bucket = []
        # bucket by bucket, then the diagonal: the order of the generator's draws
        for (g_factor, h_factor), pairs, rotary in zip(coords.gl, coords.gl_pairs,
                                                       layout.bucket_rotary, strict=True):
            applied = [pair.kind in kinds for pair in pairs]
            new_g, new_h, matrices = _move_bucket(g_factor, h_factor, applied, rotary, scale,
                                                  generator, max_condition)
            new_gl.append((new_g, new_h))
            matrices_per_bucket.append(matrices)
        diagonal_factors = None
        new_diagonal = coords.diagonal
        if coords.diagonal is not None:
            new_diagonal, diagonal_factors = _move_diagonal(coords.diagonal, scale, generator,
                                                            "diagonal" in kinds)
        moved = layout.to_parameters(coords.replace(gl=new_gl, diagonal=new_diagonal))
    result = dict(params)
    for name in report.pair_parameters + report.diagonal_parameters:
        result[name] = moved[name]
    if return_transforms:
        return result, (matrices_per_bucket, diagonal_factors)
    return result
