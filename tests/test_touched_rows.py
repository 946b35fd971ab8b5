"""The ascent on the embedding rows a batch touches gives the value of the ascent on full tables.

``touched_rows=True`` (the default) cuts every plain embedding table to the rows the batch looks
up, when that cannot change the value; ``touched_rows=False`` solves on the full tables. Both
are run here and compared: values, per-batch losses, norms and the kept perturbation, for the
measures whose solve starts at ``xi = 0``, with padding, two batches, a half-precision model
and the curved path of the other parameters. Then every case where a shortcut would be wrong
is shown to fall back to the full tables (and still agree): tied tables, a table read outside
its module, a rescaling embedding subclass, ``max_norm``, random starts.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import quotientsharp as qs
from quotientsharp.engine import NonFiniteLossError
from quotientsharp.engine import measures as measures_module
from quotientsharp.engine.touched_rows import embedding_tables, graph_uses
from tests.test_functional import Bag, _bert_batch, _ids, _measure
from tests.tuple_helpers import vanishing_off_rows

transformers = pytest.importorskip("transformers")

VOCAB = 300


def _bert(dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        vocab_size=VOCAB, max_position_embeddings=16, num_labels=3, pad_token_id=0,
        attn_implementation="eager", initializer_range=0.3)
    return transformers.BertForSequenceClassification(config).to(dtype).eval()


def _batches(count: int = 2, padded: bool = True) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(count):
        ids = torch.randint(1, VOCAB, (6, 10), generator=generator)
        mask = torch.ones_like(ids)
        if padded:
            ids[:3, 7:] = 0                       # padding tokens (padding_idx 0)
            mask[:3, 7:] = 0
        batches.append({"input_ids": ids, "attention_mask": mask,
                        "labels": torch.randint(0, 3, (6,), generator=generator)})
    return batches


def _both(model: nn.Module, batches, **options):
    # one ascent: the search's further chains start from random points of the touched rows
    # with touched_rows=True and of the whole tables without (test below)
    common = dict(rho=0.1, n_iter=6, progress=False, keep_perturbations=True, reach=False)
    cut = qs.sharpness(model, batches, touched_rows=True, **common, **options)
    full = qs.sharpness(model, batches, touched_rows=False, **common, **options)
    return cut, full


def _assert_same(cut, full, rtol: float, model: nn.Module) -> None:
    assert cut.per_batch == pytest.approx(full.per_batch, rel=rtol, abs=0)
    assert cut.perturbed_losses == pytest.approx(full.perturbed_losses, rel=rtol, abs=0)
    for a, b in zip(cut.perturbation_norms, full.perturbation_norms, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=rtol, abs=0)
    parameters = [p.detach().abs().max() for p in model.parameters()]
    for a, b in zip(cut.perturbations, full.perturbations, strict=True):
        assert a.keys() == b.keys()
        # a displacement is (theta + xi) - theta, and a parameter with a gradient at rounding
        # level (a key bias) moves by rounding noise: errors are relative to the scale of the
        # parameters and of the whole displacement, not to each entry
        scale = float(max(*parameters, *(t.abs().max() for t in b.values())))
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=rtol * scale)


MEASURES = {
    "adaptive": dict(measure="adaptive"),
    "worst-case-l2": dict(measure="worst_case", p=2),
    "worst-case-linf": dict(measure="worst_case", p="inf"),
    "adaptive-linf": dict(measure="adaptive", p="inf"),
    "geodesic-inv-2": dict(measure="geodesic", metric="inv", order=2),
    "geodesic-mix-1": dict(measure="geodesic", metric="mix", order=1, eps=0.1),
    "geodesic-euclidean-exact": dict(measure="geodesic", metric="euclidean", order="exact",
                                     exact_steps=2),
    "geodesic-curved-other": dict(measure="geodesic", metric="inv", order=2,
                                  other_path="geodesic"),
    "no-symmetries": dict(measure="geodesic", symmetries="none"),
}


@pytest.mark.parametrize("options", list(MEASURES.values()), ids=list(MEASURES))
def test_touched_rows_give_the_value_of_the_full_tables(options) -> None:
    model = _bert()
    cut, full = _both(model, _batches(), **options)
    rows = cut.settings["restricted_rows"]
    assert len(rows) == 2 and all("bert.embeddings.word_embeddings.weight" in r for r in rows)
    # the rows kept are the distinct token ids of each batch (padding included)
    for batch, kept in zip(_batches(), rows, strict=True):
        assert kept["bert.embeddings.word_embeddings.weight"] == batch["input_ids"].unique().numel()
    assert full.settings["restricted_rows"] == [{}, {}]
    _assert_same(cut, full, 1e-12, model)
    # the perturbation of the table vanishes off the touched rows
    for batch, moved in zip(_batches(), cut.perturbations, strict=True):
        table = moved["bert.embeddings.word_embeddings.weight"]
        untouched = torch.ones(VOCAB, dtype=torch.bool)
        untouched[batch["input_ids"].unique()] = False
        assert table[untouched].abs().max() == 0
        assert table[~untouched].abs().max() > 0


@pytest.mark.parametrize("options", [MEASURES["worst-case-l2"], MEASURES["geodesic-inv-2"]],
                         ids=["worst-case-l2", "geodesic-inv-2"])
def test_the_search_on_touched_rows_starts_its_chains_there(options) -> None:
    model = _bert()
    common = dict(rho=0.1, n_iter=6, progress=False, keep_perturbations=True,
                  reach={"chains": 3, "min_chains": 3, "continuations": 0})
    cut = qs.sharpness(model, _batches(), touched_rows=True, **common, **options)
    full = qs.sharpness(model, _batches(), touched_rows=False, **common, **options)
    # the first chain is the measurement's ascent from xi = 0: the same on both
    for a, b in zip(cut.chains, full.chains, strict=True):
        assert a[0] == pytest.approx(b[0], rel=1e-12)
    # every chain of the cut search, random starts included, leaves the other rows alone
    for batch, moved in zip(_batches(), cut.perturbations, strict=True):
        table = moved["bert.embeddings.word_embeddings.weight"]
        untouched = torch.ones(VOCAB, dtype=torch.bool)
        untouched[batch["input_ids"].unique()] = False
        assert table[untouched].abs().max() == 0


def test_touched_rows_in_float32_and_half_precision() -> None:
    for dtype, rtol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-5)):
        model = _bert(dtype)
        cut, full = _both(model, _batches(1), measure="geodesic", metric="inv", order=2)
        assert cut.settings["restricted_rows"][0]
        _assert_same(cut, full, rtol, model)


def test_the_shortcut_leaves_the_model_untouched_even_when_the_ascent_raises() -> None:
    model = _bert(torch.float32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(NonFiniteLossError):
        # in float32 a perturbation this large overflows inside the network
        qs.sharpness(model, _batches(1), measure="worst_case", rho=1e17, n_iter=2,
                     progress=False)
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key])


# ---------------------------------------------------------------------------- fallbacks
class TinyLM(nn.Module):
    """An embedding, a mixing layer and an output layer; variants read the table otherwise."""

    def __init__(self, kind: str = "plain") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.embed = (ScaledEmbedding(40, 6) if kind == "subclass"
                      else nn.Embedding(40, 6, max_norm=1.0 if kind == "max_norm" else None))
        self.mix = nn.Linear(6, 6)
        self.head = nn.Linear(6, 40, bias=False)
        if kind == "tied":
            self.head.weight = self.embed.weight
        self.double()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # the keyword form of the call, which the hooks must read as well as the positional one
        hidden = torch.tanh(self.mix(self.embed(input=ids))).mean(1)
        if self.kind == "reads_table":
            # a second use of the table outside its module: reads only touched rows
            hidden = hidden + self.embed.weight[ids].sum(1)
        return self.head(hidden)


class ScaledEmbedding(nn.Embedding):
    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Embedding's name)
        return super().forward(input) * 3.0


def _token_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(2)
    return [(torch.randint(0, 20, (5, 4), generator=generator),
             torch.randint(0, 40, (5,), generator=generator)) for _ in range(2)]


def test_a_plain_table_is_cut() -> None:
    model = TinyLM("plain")
    cut, full = _both(model, _token_batches(), measure="adaptive")
    assert all(r == {"embed.weight": r["embed.weight"]} for r in cut.settings["restricted_rows"])
    _assert_same(cut, full, 1e-12, model)


@pytest.mark.parametrize("kind", ["tied", "reads_table", "subclass", "max_norm"])
def test_tables_read_otherwise_are_solved_in_full(kind) -> None:
    model = TinyLM(kind)
    cut, full = _both(model, _token_batches(), measure="adaptive")
    assert cut.settings["restricted_rows"] == [{}, {}]
    assert cut.per_batch == full.per_batch


@pytest.mark.parametrize("options", [dict(random_init=True), dict(restarts=1)],
                         ids=["random_init", "restarts"])
def test_random_starts_are_solved_in_full(options) -> None:
    cut, full = _both(TinyLM("plain"), _token_batches(), measure="adaptive", **options)
    assert cut.settings["restricted_rows"] == [{}, {}]
    assert cut.per_batch == full.per_batch


def test_embedding_tables_finds_plain_untied_tables_only() -> None:
    names = lambda model: [n for n, _ in model.named_parameters()]  # noqa: E731
    assert list(embedding_tables(TinyLM("plain"), names(TinyLM("plain")))) == ["embed.weight"]
    for kind in ("tied", "subclass", "max_norm"):
        model = TinyLM(kind)
        assert embedding_tables(model, names(model)) == {}


def test_graph_uses_counts_each_consumer_of_one_output() -> None:
    leaf = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    other = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    # a fused operation has one node for all its outputs: only the consumers of the output
    # in question count
    first, second = torch._foreach_mul([leaf, other], 2.0)
    ids = torch.tensor([0, 2])
    loss = (nn.functional.embedding(ids, first).sum() + second.sum()
            + nn.functional.embedding(ids, leaf).sum())
    assert sorted(graph_uses(loss, first)) == ["EmbeddingBackward0"]
    assert sorted(graph_uses(loss, second)) == ["SumBackward0"]
    # a leaf: every node that takes it (the fused product and the lookup)
    assert len(graph_uses(loss, leaf)) == 2 and "EmbeddingBackward0" in graph_uses(loss, leaf)
    assert len(graph_uses(loss, other)) == 1
    assert graph_uses(torch.zeros(()), leaf) == []


# ---------------------------------------------------------------------------- the geometry
@pytest.mark.parametrize("metric", ["adaptive", "euclidean"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_point_cut_to_rows_is_the_point_on_vectors_that_vanish_off_them(metric, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(7, 3), (5,), (4, 2)]
    x = tuple(torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes)
    x[0][2] = 0.0                                     # a zero weight: no room to move
    quotient = qs.AdaptiveQuotient.of(x, metric)
    frozen = quotient.at(x)
    frozen.norm(x)                                    # fills the 1/|w| cache before the cut
    rows = {0: torch.tensor([1, 2, 5]), 2: torch.tensor([3])}
    cut = frozen.on_rows(rows)

    def restrict(v):
        return tuple(t.index_select(0, rows[i]) if i in rows else t for i, t in enumerate(v))

    u = vanishing_off_rows(tuple(torch.randn(s, generator=generator, dtype=torch.float64)
                                 for s in shapes), rows)
    e = vanishing_off_rows(tuple(torch.randn(s, generator=generator, dtype=torch.float64)
                                 for s in shapes), rows)
    torch.testing.assert_close(cut.norm(restrict(u)), frozen.norm(u), rtol=1e-14, atol=0)
    for full, part in ((frozen.riemannian_gradient(e), cut.riemannian_gradient(restrict(e))),
                       (frozen.geodesic(u, 1.0, 2), cut.geodesic(restrict(u), 1.0, 2)),
                       (frozen.geodesic(u, 1.0, "exact"),
                        cut.geodesic(restrict(u), 1.0, "exact"))):
        for a, b in zip(restrict(full), part, strict=True):
            assert torch.equal(a, b)
    # the raised gradient of a gradient that vanishes off the rows vanishes there too
    assert torch.equal(torch.stack([t.abs().sum() for t in frozen.riemannian_gradient(e)]),
                       torch.stack([t.abs().sum() for t in vanishing_off_rows(
                           frozen.riemannian_gradient(e), rows)]))


def test_only_a_diagonal_metric_can_be_cut_to_rows() -> None:
    generator = torch.Generator().manual_seed(0)
    gl = qs.GLQuotient("mix")
    x = gl.random_point((), shapes=[(5, 2), (4, 2)], generator=generator,
                        dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="not diagonal"):
        gl.at(x).on_rows({0: torch.tensor([0, 1])})
    batched = qs.AdaptiveQuotient("adaptive", point_ndims=(1,))
    with pytest.raises(ValueError, match="unbatched"):
        batched.at((torch.ones(3, 4, dtype=torch.float64),)).on_rows({0: torch.tensor([0])})
    product = qs.ProductQuotient([gl, qs.AdaptiveQuotient.of([torch.ones(3)])])
    frozen = product.at((*x, torch.ones(3, dtype=torch.float64)))
    assert frozen.on_rows({2: torch.tensor([1])}).x[2].shape == (1,)
    with pytest.raises(NotImplementedError):
        frozen.on_rows({0: torch.tensor([1])})
    with pytest.raises(ValueError, match="slots"):
        frozen.on_rows({3: torch.tensor([1])})


def _on_device(solve):
    """``solve`` (the solver's ``ascend`` or ``search``) with its decisions on the device."""

    def on_device(*args, **kwargs):
        return solve(*args, **{**kwargs, "host_decisions": False})

    return on_device


@pytest.mark.parametrize("options", [dict(measure="adaptive"),
                                     dict(measure="geodesic", metric="mix", order=2),
                                     dict(measure="worst_case", p=2, restarts=1)],
                         ids=["adaptive", "geodesic-mix", "restarts"])
def test_decisions_on_the_host_give_the_device_path_bit_for_bit(options, monkeypatch) -> None:
    model, batches = _bert(), _batches()
    host = qs.sharpness(model, batches, rho=0.1, n_iter=9, progress=False, **options)
    for name in ("ascend", "search"):       # the path a CUDA run takes, on the CPU
        monkeypatch.setattr(measures_module, name, _on_device(getattr(measures_module, name)))
    device = qs.sharpness(model, batches, rho=0.1, n_iter=9, progress=False, **options)
    assert host.per_batch == device.per_batch
    assert host.traces == device.traces
    assert host.perturbation_norms == device.perturbation_norms


def test_float64_geometry_for_a_float32_model() -> None:
    # the forward in float32, the geometry, gradients and iterate in float64: the measured value
    # is that of the float32 loss, maximised in float64
    model = _bert(torch.float32)
    result = qs.sharpness(model, _batches(1), measure="geodesic", metric="mix", rho=0.1,
                          n_iter=4, progress=False, geometry_dtype=torch.float64)
    assert result.settings["geometry_dtype"] == "float64"
    as_name = qs.sharpness(model, _batches(1), measure="geodesic", metric="mix", rho=0.1,
                           n_iter=4, progress=False, geometry_dtype="float64")
    assert as_name.per_batch == result.per_batch
    default = qs.sharpness(model, _batches(1), measure="geodesic", metric="mix", rho=0.1,
                           n_iter=4, progress=False)
    assert default.settings["geometry_dtype"] == "float32"
    # float32 rounding of the same maximisation
    assert result.value == pytest.approx(default.value, rel=1e-3)
    for bad in ("float16", torch.bfloat16, 64):
        with pytest.raises(ValueError, match="geometry_dtype"):
            qs.sharpness(model, _batches(1), measure="adaptive", rho=0.1, progress=False,
                         geometry_dtype=bad)


class _CountingEmbedding(nn.Module):
    """A bag-of-words classifier that counts its forward calls (one embedding table, so the
    touched-rows cut applies)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.table = nn.Embedding(12, 4)
        self.head = nn.Linear(4, 2)
        with torch.no_grad():
            self.table.weight.copy_(torch.randn(12, 4, generator=gen))
            self.head.weight.copy_(torch.randn(2, 4, generator=gen))
        self.forwards = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.head(self.table(ids).mean(-2))


@pytest.mark.parametrize("measure", ["adaptive", "worst_case"])
def test_the_touched_rows_solve_starts_from_the_clean_evaluation(measure):
    # the cut solve reuses the evaluation at xi = 0 as the full one does: as many forwards
    ids, y = torch.tensor([[1, 3, 3], [5, 1, 7]]), torch.tensor([0, 1])
    forwards = {}
    for touched in (True, False):
        model = _CountingEmbedding()
        qs.sharpness(model, [(ids, y)], measure=measure, rho=0.05, n_iter=4, seed=0,
                     progress=False, touched_rows=touched)
        forwards[touched] = model.forwards
    assert forwards[True] == forwards[False]


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_int32_token_ids_equal_int64_on_bert(bert):
    wide = _measure(bert, [_bert_batch(torch.int64)], "geodesic", n_iter=2)
    narrow = _measure(bert, [_bert_batch(torch.int32)], "geodesic", n_iter=2)
    assert narrow.settings["touched_rows"] is True
    assert narrow.value == pytest.approx(wide.value, rel=1e-6, abs=1e-9)
    assert narrow.settings["restricted_rows"] == wide.settings["restricted_rows"]


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_int32_token_ids_equal_int64_on_a_custom_embedding():
    ids, labels = _ids()
    wide = _measure(Bag(), [(ids, labels)], "adaptive")
    narrow = _measure(Bag(), [(ids.int(), labels)], "adaptive")
    assert narrow.value == pytest.approx(wide.value, rel=1e-6)
