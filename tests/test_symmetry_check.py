"""A binding is checked against the model (issue 22, item 1; issue 24's silent binding cases)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import quotientsharp as qs
from tests.bottleneck_symmetry import (
    BottleneckGL,
    bottleneck_batches,
    bottleneck_binding,
    bottleneck_model,
)


class RowScale(qs.SymmetryQuotient):
    """Positive scaling of each incoming row (with its bias) of a layer."""

    name = "row-scale"
    point_ndims = (1,)

    def inner(self, x, u, v):
        return (u[0] * v[0]).sum(-1) / x[0].square().sum(-1)

    def vertical(self, x, a):
        return (a * x[0],)

    def act(self, x, g):
        return (g * x[0],)

    def algebra_shape(self, x):
        return (1,)


def _rows_binding(name="bn rows", quotient=None, from_point=None):
    def to_point(p):
        return (torch.cat([p["0.weight"], p["0.bias"][:, None]], 1),)

    def back(x):
        return {"0.weight": x[0][:, :-1], "0.bias": x[0][:, -1]}

    return qs.QuotientBinding(quotient or RowScale(), ["0.weight", "0.bias"], to_point,
                              from_point or back, folded=1, name=name)


def _batchnorm_model(dtype=torch.float64):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    model = model.to(dtype)
    x = torch.randn(32, 5, dtype=dtype)
    model.train()
    with torch.no_grad():
        for _ in range(3):              # running statistics away from their initial values
            model(x)
    return model, [(x, torch.randint(0, 3, (32,)))]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batchnorm_rows_in_eval_mode_are_refused_naming_the_binding(dtype):
    model, batches = _batchnorm_model(dtype)
    model.eval()
    with pytest.raises(qs.SymmetryCheckError, match="binding 'bn rows'.*does NOT hold") as err:
        qs.sharpness(model, batches, rho=0.05, symmetries=_rows_binding(), n_iter=3,
                     progress=False)
    assert isinstance(err.value, ValueError)
    assert "tolerance" in str(err.value)
    assert model.training is False          # the mode restored
    report = qs.models.check_symmetry(model, _rows_binding(), batches[0])
    assert not report[0].passed and report[0].output_change > 1e-2


def test_batchnorm_rows_in_train_mode_change_by_the_eps_of_batchnorm_only():
    model, batches = _batchnorm_model()
    model.train()
    (check,) = qs.models.check_symmetry(model, _rows_binding(), batches[0])
    # BatchNorm's eps breaks the symmetry slightly: far below the eval-mode change, yet above
    # float64 rounding, so the float64 check sees it
    assert 1e-8 < check.output_change < 1e-3


def test_opting_out_is_recorded_in_the_settings():
    model, batches = _batchnorm_model()
    model.eval()
    result = qs.sharpness(model, batches, rho=0.05, symmetries=_rows_binding(), n_iter=3,
                          progress=False, check_symmetry=False)
    assert result.settings["check_symmetry"] is False
    on = qs.sharpness(bottleneck_model(), bottleneck_batches(), rho=0.1, n_iter=3,
                      symmetries=bottleneck_binding(None), progress=False)
    assert on.settings["check_symmetry"] is True
    with pytest.raises(TypeError, match="check_symmetry"):
        qs.sharpness(model, batches, rho=0.05, symmetries=_rows_binding(), n_iter=3,
                     progress=False, check_symmetry="no")


def test_a_parameter_without_symmetry_is_refused():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    batch = (torch.randn(16, 5, dtype=torch.float64), torch.randint(0, 3, (16,)))
    with pytest.raises(qs.SymmetryCheckError, match="binding 'rows alone'"):
        qs.sharpness(mlp, [batch], rho=0.05, symmetries=_rows_binding("rows alone"),
                     n_iter=3, progress=False)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_bottleneck_passes_its_check_in_each_dtype(dtype):
    model = bottleneck_model().to(dtype)
    x, y = bottleneck_batches()[0]
    (check,) = qs.models.check_symmetry(model, bottleneck_binding(model), (x.to(dtype), y))
    assert check.passed
    assert check.output_change < 100 * torch.finfo(dtype).eps
    assert check.tolerance == pytest.approx(torch.finfo(dtype).eps ** 0.5)


def test_the_bottleneck_is_checked_at_an_ill_conditioned_point():
    model = bottleneck_model()
    with torch.no_grad():
        scale = torch.tensor([1e-3, 1.0, 1e3], dtype=torch.float64)
        model[0].weight.mul_(scale[:, None])
        model[1].weight.div_(scale)
    batches = bottleneck_batches()
    (check,) = qs.models.check_symmetry(model, bottleneck_binding(model), batches[0])
    assert check.passed


def test_the_bottleneck_gl_symmetry_is_invariant_where_adaptive_moves():
    model, batches = bottleneck_model(), bottleneck_batches()
    g = torch.linalg.matrix_exp(torch.randn(3, 3, dtype=torch.float64,
                                            generator=torch.Generator().manual_seed(5)))
    moved = bottleneck_model()
    with torch.no_grad():
        moved[0].weight.copy_(g @ model[0].weight)
        moved[1].weight.copy_(model[1].weight @ torch.linalg.inv(g))
    options = {"rho": 0.1, "n_iter": 10, "progress": False}
    values = [qs.sharpness(net, batches, symmetries=bottleneck_binding(net), **options).value
              for net in (model, moved)]
    assert values[0] > 0
    assert abs(values[1] - values[0]) <= 1e-8 * values[0]
    adaptive = [qs.sharpness(net, batches, measure="adaptive", **options).value
                for net in (model, moved)]
    assert abs(adaptive[1] - adaptive[0]) > 0.1 * adaptive[0]


def test_a_detached_from_point_is_an_error_naming_the_binding():
    model, batches = _batchnorm_model()
    model.train()

    def detached(x):
        return {"0.weight": x[0][:, :-1].detach(), "0.bias": x[0][:, -1].detach()}

    with pytest.raises(qs.SymmetryCheckError, match="binding 'bn rows'.*no gradient reaches"):
        qs.sharpness(model, batches, rho=0.05, symmetries=_rows_binding(from_point=detached),
                     check_symmetry=False, n_iter=3, progress=False)


def test_a_wrong_shaped_vertical_is_an_error_naming_vertical_and_the_shapes():
    class NarrowVertical(RowScale):
        def vertical(self, x, a):
            return (a * x[0][..., :1],)     # shape (8, 1) for an (8, 6) factor: broadcasts

    model, batches = _batchnorm_model()
    # the geometry's method check runs first, on every row of the (8, 6) factor
    with pytest.raises(ValueError, match=r"NarrowVertical\.vertical returned component 0 of "
                                         r"shape \(8, 1\), expected the point's \(8, 6\)"):
        qs.sharpness(model, batches, rho=0.05, symmetries=_rows_binding(
            quotient=NarrowVertical()), check_symmetry=False, n_iter=3, progress=False)


class _Halved(RowScale):
    def horizontal_projection(self, x, u):      # not idempotent: P(P(u)) = P(u) / 2
        return tuple(0.5 * t for t in qs.reference.horizontal_projection(self, x, u))


class _PlusVertical(RowScale):
    def horizontal_projection(self, x, u):      # idempotent, but adds a vertical vector
        h = qs.reference.horizontal_projection(self, x, u)
        return (h[0] + 0.1 * x[0],)


@pytest.mark.parametrize(("cls", "words"), [(_Halved, "not idempotent"),
                                             (_PlusVertical, "horizontal vectors")])
def test_a_broken_horizontal_projection_is_refused(cls, words):
    model, batches = _batchnorm_model()
    with pytest.raises(qs.SymmetryCheckError, match=f"{cls.__name__}.horizontal_projection.*"
                                                    f"{words}"):
        qs.sharpness(model, batches, rho=0.05, symmetries=_rows_binding(quotient=cls()),
                     check_symmetry=False, n_iter=3, progress=False)


def test_a_correct_closed_form_projection_passes():
    class Fast(RowScale):
        def horizontal_projection(self, x, u):
            a = (u[0] * x[0]).sum(-1, keepdim=True) / x[0].square().sum(-1, keepdim=True)
            return (u[0] - a * x[0],)

    model, batches = _batchnorm_model()
    model.train()
    qs.models.check_symmetry(model, _rows_binding(quotient=Fast()), batches[0])


def test_a_parameter_the_model_lacks_is_named():
    model = bottleneck_model()
    binding = qs.QuotientBinding(BottleneckGL(), ["0.weight", "2.weight"], name="b")
    with pytest.raises(qs.SymmetryCheckError, match=r"'2.weight'"):
        qs.models.check_symmetry(model, binding, bottleneck_batches()[0])


def test_geodesic_without_symmetry_warns_and_says_how_to_bind_one():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    batch = (torch.randn(16, 5), torch.randint(0, 3, (16,)))
    with pytest.warns(qs.NoSymmetryWarning, match="geodesic sharpness equals adaptive") as got:
        result = qs.sharpness(mlp, [batch], rho=0.05, n_iter=3, progress=False)
    assert issubclass(qs.NoSymmetryWarning, UserWarning)
    assert "--symmetry" in str(got[0].message)
    assert result.settings["symmetry_found"] is False
    adaptive = qs.sharpness(mlp, [batch], rho=0.05, n_iter=3, progress=False,
                            measure="adaptive")
    assert result.value == pytest.approx(adaptive.value, rel=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        qs.sharpness(mlp, [batch], rho=0.05, n_iter=3, progress=False, symmetries="none")


@pytest.mark.parametrize("seed", range(2))
def test_the_no_symmetry_warning_says_what_geodesic_sharpness_equals_with_other_options(seed):
    # with other_metric="euclidean" the other factor is the plain L2 ball: worst-case
    # sharpness, not adaptive, which the warning used to claim; along the adaptive metric's
    # geodesic at order 2 it is neither
    torch.manual_seed(seed)
    mlp = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    batch = (torch.randn(16, 5, dtype=torch.float64), torch.randint(0, 3, (16,)))
    measured = {}
    for name, options in (("euclidean", {"other_metric": "euclidean"}),
                          ("path", {"other_path": "geodesic"})):
        with pytest.warns(qs.NoSymmetryWarning) as got:
            measured[name] = qs.sharpness(mlp, [batch], rho=0.05, n_iter=3, progress=False,
                                          reach=False, **options).value
        (note,) = (str(w.message) for w in got if w.category is qs.NoSymmetryWarning)
        assert "--symmetry" in note
        if name == "euclidean":
            assert "equals worst-case sharpness (p=2)" in note
        else:
            assert "equals" not in note and "other_path='geodesic'" in note
    worst = qs.sharpness(mlp, [batch], rho=0.05, n_iter=3, progress=False, reach=False,
                         measure="worst_case").value
    adaptive = qs.sharpness(mlp, [batch], rho=0.05, n_iter=3, progress=False, reach=False,
                            measure="adaptive").value
    assert measured["euclidean"] == pytest.approx(worst, rel=1e-9)
    assert measured["path"] != pytest.approx(adaptive, rel=1e-6)


def _train_mode_batchnorm():
    model, batches = _batchnorm_model()
    model.train()
    return model, batches[0]


@pytest.mark.parametrize(("from_point", "match"), [
    # scales the rows it returns: not the inverse of to_point, yet the scaled rows are still
    # a scaling of the model's rows, and train-mode BatchNorm absorbs it
    (lambda x: {"0.weight": 2 * x[0][:, :-1], "0.bias": 2 * x[0][:, -1]},
     r"binding 'bn rows': from_point is not the inverse of to_point on '0.weight'"),
    (lambda x: {"0.weight": x[0][:, :-1].T, "0.bias": x[0][:, -1]},
     r"binding 'bn rows': from_point\(to_point\(theta\)\) gives '0.weight' the shape \(5, 8\)"),
])
def test_check_symmetry_applies_the_binding_rules_of_sharpness(from_point, match):
    model, batch = _train_mode_batchnorm()
    with pytest.raises(ValueError, match=match):
        qs.check_symmetry(model, _rows_binding(from_point=from_point), batch)


def test_check_symmetry_refuses_folded_that_is_not_the_points_leading_dimensions():
    model, batch = _train_mode_batchnorm()
    binding = _rows_binding()
    wrong = qs.QuotientBinding(binding.quotient, binding.parameters, binding.to_point,
                               binding.from_point, folded=0, name="bn rows")
    with pytest.raises(ValueError, match=r"binding 'bn rows': the point has \[1\] leading"):
        qs.check_symmetry(model, wrong, batch)


def test_check_symmetry_still_compares_alternative_bindings_of_the_same_parameters():
    model, batch = _train_mode_batchnorm()
    first, second = qs.check_symmetry(model, [_rows_binding("a"), _rows_binding("b")], batch)
    assert (first.binding, second.binding) == ("a", "b")
    assert first.loss_change == second.loss_change


def test_check_symmetry_refuses_a_random_forward_and_keeps_the_random_state():
    # dropout in train mode: a true symmetry was reported as "does NOT hold", and the
    # caller's generator advanced
    model, batch = _train_mode_batchnorm()
    noisy = nn.Sequential(*model, nn.Dropout(0.5), nn.Linear(3, 3)).double().train()
    rows = _rows_binding()
    assert qs.check_symmetry(noisy.eval(), rows, batch)[0].passed is False   # eval: BatchNorm
    state = torch.get_rng_state()
    with pytest.raises(ValueError, match=r"batch: two forwards at the same parameters differ "
                                         r".*dropout or another random layer in train mode"):
        qs.check_symmetry(noisy.train(), rows, batch)
    assert torch.equal(state, torch.get_rng_state())


def test_check_symmetry_names_a_model_it_cannot_run():
    model, batch = _batchnorm_model()
    with pytest.raises(TypeError, match=r"model is wrapped in nn.DataParallel.*model.module"):
        qs.check_symmetry(nn.DataParallel(model), _rows_binding(), batch)
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got str"):
        qs.check_symmetry("model", _rows_binding(), batch)


# ------------------------------------------------------------- discovered symmetries, checked
def _bert(initializer_range: float, dtype=torch.float32):
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, num_labels=2,
                                     attn_implementation="eager",
                                     initializer_range=initializer_range)
    model = transformers.BertForSequenceClassification(config).to(dtype).eval()
    generator = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(0, 50, (4, 8), generator=generator),
             "labels": torch.randint(0, 2, (4,), generator=generator)}
    return model, batch


def _normalise_heads(module, inputs, output):
    # per-head normalisation of a projection's output: the pairs' GL(8) is then no symmetry
    b, t, d = output.shape
    heads = output.view(b, t, 4, d // 4)
    return (heads / heads.norm(dim=-1, keepdim=True)).view(b, t, d)


@pytest.mark.parametrize("projection, kind", [("query", "qk"), ("value", "vo")])
def test_a_discovered_pair_that_is_no_symmetry_is_refused_naming_kind_and_module(projection,
                                                                                 kind):
    # attention scores of a model with weights of trained size (a random one of initializer
    # range 0.02 has scores near 0, where the broken symmetry hardly shows)
    model, batch = _bert(0.3)
    attention = model.bert.encoder.layer[1].attention.self
    getattr(attention, projection).register_forward_hook(_normalise_heads)
    options = dict(measure="geodesic", rho=0.05, n_iter=2, progress=False, reach=False)
    with pytest.raises(qs.SymmetryCheckError,
                       match=f"the {kind} pairs of bert.encoder.layer.1.attention "
                             r"\(changed by") as info:
        qs.sharpness(model, [batch], **options)
    assert "layer.0" not in str(info.value)       # the other layer's pairs hold
    # measured anyway on request, and without the check nothing says so
    assert math.isfinite(qs.sharpness(model, [batch], check_symmetry=False, **options).value)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_discovered_symmetries_that_hold_pass_and_leave_the_value_unchanged(dtype):
    model, batch = _bert(0.3, dtype)
    options = dict(measure="geodesic", rho=0.05, n_iter=2, progress=False)
    checked = qs.sharpness(model, [batch], **options)
    assert checked.per_batch == qs.sharpness(model, [batch], check_symmetry=False,
                                             **options).per_batch


def _round_through_float32(module, inputs, output):
    # what GPT-J, ESM and Cohere do in a float64 model: queries and keys cast to float32
    return output.float().to(output.dtype)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_float64_model_that_rounds_queries_and_keys_through_float32_is_not_refused(seed):
    # its true symmetries then change the outputs by float32's rounding (~1e-7), above
    # float64's sqrt(eps) (1.5e-8): the tolerance follows the forward's coarsest rounding
    model, batch = _bert(0.4, torch.float64)
    for layer in model.bert.encoder.layer:
        for projection in (layer.attention.self.query, layer.attention.self.key):
            projection.register_forward_hook(_round_through_float32)
    options = dict(measure="geodesic", rho=0.05, n_iter=2, progress=False, reach=False,
                   seed=seed)
    checked = qs.sharpness(model, [batch], **options)
    assert checked.per_batch == qs.sharpness(model, [batch], check_symmetry=False,
                                             **options).per_batch


def _float32_table(module, inputs, output):
    # a float32 computation the group elements do not reach (a rotary model's position table
    # computed in float32): rounded alike at theta and at the moved point
    table = torch.arange(output.shape[1], dtype=torch.float32).sin()
    return output + 0.0 * table.to(output.dtype)[None, :, None]


@pytest.mark.parametrize("projection, kind", [("query", "qk"), ("value", "vo")])
def test_a_float32_table_outside_the_moved_parameters_keeps_the_float64_tolerance(projection,
                                                                                 kind):
    # small weights (range 0.02): breaking a pair changes the outputs by ~1e-5, which only
    # float64's tolerance (1.5e-8) sees, so a float32 table elsewhere must not loosen it
    model, batch = _bert(0.02, torch.float64)
    model.bert.embeddings.register_forward_hook(_float32_table)
    getattr(model.bert.encoder.layer[1].attention.self, projection).register_forward_hook(
        _normalise_heads)
    with pytest.raises(qs.SymmetryCheckError, match=f"the {kind} pairs of "
                                                    r"bert.encoder.layer.1.attention"):
        qs.sharpness(model, [batch], measure="geodesic", rho=0.05, n_iter=2, progress=False,
                     reach=False)


@pytest.mark.parametrize("projection, kind", [("query", "qk"), ("value", "vo")])
def test_a_false_symmetry_is_refused_where_the_forward_rounds_through_float32(projection, kind):
    model, batch = _bert(0.3, torch.float64)
    attention = model.bert.encoder.layer[1].attention.self
    for rounded in (attention.query, attention.key, attention.value):
        rounded.register_forward_hook(_round_through_float32)
    getattr(attention, projection).register_forward_hook(_normalise_heads)
    with pytest.raises(qs.SymmetryCheckError, match=f"the {kind} pairs of "
                                                    r"bert.encoder.layer.1.attention"):
        qs.sharpness(model, [batch], measure="geodesic", rho=0.05, n_iter=2, progress=False,
                     reach=False)


def _bert_without_head(initializer_range: float):
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     attn_implementation="eager",
                                     initializer_range=initializer_range)
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def _mean_square(output, target):
    # the last hidden state is layer-normalised (gain 1, shift 0 at initialisation): its mean
    # square is 1 whatever the attention computed, so this loss hides any change
    return output.last_hidden_state.square().mean() + 0.0 * target.sum()


@pytest.mark.parametrize("projection, kind", [("query", "qk"), ("value", "vo")])
def test_a_model_without_a_head_is_checked_on_its_last_hidden_state(projection, kind):
    model = _bert_without_head(0.3)
    attention = model.encoder.layer[1].attention.self
    getattr(attention, projection).register_forward_hook(_normalise_heads)
    generator = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(0, 50, (4, 8), generator=generator),
             "labels": torch.zeros(4)}
    with pytest.raises(qs.SymmetryCheckError, match=f"the {kind} pairs of "
                                                    r"encoder.layer.1.attention"):
        qs.sharpness(model, [batch], measure="geodesic", rho=0.05, n_iter=2, progress=False,
                     reach=False, loss=_mean_square)


def test_a_model_without_a_head_whose_symmetries_hold_passes():
    model = _bert_without_head(0.3)
    generator = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(0, 50, (4, 8), generator=generator),
             "labels": torch.randn(4, 8, 32, generator=generator)}

    def squared_error(output, target):
        return (output.last_hidden_state - target).square().mean()

    options = dict(measure="geodesic", rho=0.05, n_iter=2, progress=False, reach=False,
                   loss=squared_error)
    checked = qs.sharpness(model, [batch], **options)
    assert checked.per_batch == qs.sharpness(model, [batch], check_symmetry=False,
                                             **options).per_batch


def test_a_change_that_is_not_a_number_is_never_within_a_tolerance():
    from quotientsharp.models.symmetry_check import relative_change

    # max(small, nan) is small: a NaN change read as such would pass every symmetry check
    moved = relative_change(torch.tensor([math.nan, 1.0]), torch.tensor([1.0, 1.0]))
    assert moved == math.inf and max(1e-9, moved) > 1.0
