"""How often a ``sharpness`` call hops between quotientsharp modules.

Traces one ``sharpness(model, batches, measure="geodesic", rho=0.1, n_iter=2, progress=False,
reach=False)`` call (one ascent: the per-iteration structure) on a small seeded BERT (the
README's configuration, one batch) with :func:`sys.setprofile` and counts module transitions
among the ``quotientsharp`` modules, from the call's start **to the end of the call** (with
one batch the per-batch value is the call's only one, so the end of the call is when the result
it feeds is assembled):

- a *hop*: two consecutive ``quotientsharp`` frames (``call`` events, frames of other packages
  skipped) in different modules;
- a *re-entry*: a hop into a module that was visited earlier in the trace.

Run ``python benchmarks/module_trace.py`` (``--sequence`` prints every module visited, in
order: how a call flows through the layers and the engine's stages).

Measured (transformers 5.25, torch on CPU, value 0.00103408 both times), to the end of the call;
``quotientsharp`` counts every module of the package (discovery in ``models`` is most of it),
``quotientsharp.engine`` the engine's alone:

- 59c52f4 (before the engine's stages): quotientsharp 574 hops, 551 re-entries; engine 90 hops,
  82 re-entries;
- the engine branch (stages declared): quotientsharp 595 hops, 566 re-entries; engine 109 hops,
  95 re-entries.

The engine's stages are now modules of their own (options, registry, layouts, space,
decisions, result: 15 engine modules instead of 9), entered in turn by the pipeline; the counts
measure module boundaries crossed, and there are more of them, so they grew (by about a fifth).
The order they are crossed in is the stages' (``--sequence``): validate, registry, layout,
first evaluation, geometry once, then per batch space, solver, and the result last.

A hop count also grows with every loop that calls into another module (discovery's walker
trying each recogniser on each module is most of the package's count), so the script also
counts *callbacks* (:func:`traced_callbacks`): calls into a module that is still running
further down the stack, the back and forth of tangled modules. On 7441d5a (release 0.1): 20
callbacks, 4 pairs: ``gl.inv -> gl.point`` 14, ``sharpness.ball -> sharpness.solver`` 3 (the
ball calling the solver's ``_lift``), ``sharpness.solver -> sharpness.measures`` 2 (the
objective closure handed down), ``product -> quotient`` 1. Now: 26 callbacks, 1 pair,
``core.gl.inv -> core.gl.point``: a metric's frozen point (``inv.py``) is a subclass of the GL
point (``point.py``) whose template methods call the metric's formulas, which call the base's
helpers (inheritance, not a tangle; more calls now because the metric objects of every family
resolve through the same registry). The engine has no callback left.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

PACKAGE = "quotientsharp"


@dataclass
class ModuleTrace:
    """The module transitions of one traced call, among the modules under ``prefix``.

    Attributes
    ----------
    prefix
        The modules counted (``"quotientsharp"``: all of the package's; ``"quotientsharp.engine"``:
        the engine's alone, every other frame skipped).
    hops
        Consecutive counted call events in different modules.
    reentries
        Hops into a module visited earlier in the trace.
    sequence
        The modules in the order they were entered (the first module, then one entry per hop).
    calls
        Counted call events (functions entered).
    """

    prefix: str = PACKAGE
    hops: int = 0
    reentries: int = 0
    sequence: list[str] = field(default_factory=list)
    calls: int = 0

    @classmethod
    def of(cls, modules: list[str], prefix: str = PACKAGE) -> ModuleTrace:
        """The transitions of the call events ``modules`` (module names, in order)."""
        trace = cls(prefix)
        visited: set[str] = set()
        for module in modules:
            if not (module == prefix or module.startswith(prefix + ".")):
                continue
            trace.calls += 1
            if trace.sequence and module == trace.sequence[-1]:
                continue
            if trace.sequence:
                trace.hops += 1
                trace.reentries += module in visited
            visited.add(module)
            trace.sequence.append(module)
        return trace

    @property
    def modules(self) -> set[str]:
        """The distinct modules visited."""
        return set(self.sequence)


def traced_modules(call: Callable[[], Any]) -> tuple[list[str], Any]:
    """Run ``call()`` under :func:`sys.setprofile`.

    Returns
    -------
    (list[str], Any)
        The module of every ``quotientsharp`` function entered (``call`` events, in order, until
        ``call`` returns), and what ``call`` returned.
    """
    modules: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if isinstance(module, str) and module.startswith(PACKAGE):
                modules.append(module)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        value = call()
    finally:
        sys.setprofile(previous)
    return modules, value


def traced_callbacks(call: Callable[[], Any]) -> tuple[Counter[tuple[str, str]], int, Any]:
    """Calls back into a module that is still running further down the call stack.

    A layered call flows down and returns: ``api`` calls ``solver``, which calls ``ball``,
    which returns. A *callback* is a call from a module ``C`` into a module ``M`` (``M != C``)
    while a frame of ``M`` is active below ``C``'s: control went ``M -> ... -> C -> M``, the
    back and forth of tangled modules (a closure handed down, a helper of the caller's module
    imported by the callee). Frames of other packages are skipped.

    Returns
    -------
    (Counter, int, Any)
        Callbacks by ``(caller module, callee module)``, the number of ``quotientsharp`` calls,
        and what ``call`` returned.
    """
    callbacks: Counter[tuple[str, str]] = Counter()
    calls = 0

    def module_of(frame: FrameType) -> str:
        name = frame.f_globals.get("__name__", "")
        return name if isinstance(name, str) else ""

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event != "call":
            return
        module = module_of(frame)
        if not module.startswith(PACKAGE):
            return
        calls += 1
        below = frame.f_back
        caller = None
        while below is not None:
            name = module_of(below)
            if name.startswith(PACKAGE):
                if caller is None:
                    caller = name
                    if caller == module:
                        return
                elif name == module:
                    callbacks[caller, module] += 1
                    return
            below = below.f_back

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        value = call()
    finally:
        sys.setprofile(previous)
    return callbacks, calls, value


def trace_modules(call: Callable[[], Any], prefix: str = PACKAGE) -> tuple[ModuleTrace, Any]:
    """:class:`ModuleTrace` of ``call()`` among the modules under ``prefix``, and its value."""
    modules, value = traced_modules(call)
    return ModuleTrace.of(modules, prefix), value


def small_bert() -> tuple[Any, list[dict[str, Any]]]:
    """A seeded 2-layer BERT (eager attention) and one batch of 8 x 12 random tokens."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=100, num_labels=2,
                                     attn_implementation="eager")
    model = transformers.BertForSequenceClassification(config).eval()
    generator = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 100, (8, 12), generator=generator),
                "labels": torch.randint(0, 2, (8,), generator=generator)}]
    return model, batches


def small_bert_call() -> Callable[[], Any]:
    """The traced call: geodesic sharpness of :func:`small_bert` on its batch."""
    import quotientsharp as qs

    model, batches = small_bert()
    # one untraced call first: lazy imports and first-call caches are not the engine's structure
    qs.sharpness(model, batches, measure="geodesic", rho=0.1, n_iter=2, progress=False, reach=False)
    return lambda: qs.sharpness(model, batches, measure="geodesic", rho=0.1, n_iter=2,
                                progress=False, reach=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequence", action="store_true", help="print every module visited")
    args = parser.parse_args(argv)
    call = small_bert_call()
    modules, result = traced_modules(call)
    print(f"geodesic sharpness {result.value:.6g}, traced to the end of the call")
    for prefix in (PACKAGE, PACKAGE + ".engine"):
        trace = ModuleTrace.of(modules, prefix)
        print(f"{prefix}: {trace.calls} calls, {trace.hops} hops, {trace.reentries} "
              f"re-entries, {len(trace.modules)} modules")
        if args.sequence:
            print("  " + " -> ".join(name.removeprefix(PACKAGE + ".") for name in trace.sequence))
    callbacks, calls, _ = traced_callbacks(call)
    print(f"callbacks into a module still running below the caller: {sum(callbacks.values())} "
          f"of {calls} calls, {len(callbacks)} distinct (caller -> callee) pairs")
    for (caller, callee), count in callbacks.most_common():
        print(f"  {count:5d}  {caller.removeprefix(PACKAGE + '.')} -> "
              f"{callee.removeprefix(PACKAGE + '.')}")


if __name__ == "__main__":
    main()
