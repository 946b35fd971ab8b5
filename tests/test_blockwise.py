"""Block-wise sharpness (``blockwise=True``): norm share and loss change of every block of the
best perturbation, in the result, the ``measure`` command's table and JSON, and a plot.

- where one block's perturbation dominates the loss (its output enters scaled by 10), that
  block carries nearly all the norm and the loss change, for each ascent measure;
- shares add up to 1 and agree with the per-kind norms the result already reports (heads,
  diagonal pairs, bindings, other parameters);
- blocks the loss does not depend on (the query/key pairs of one-token inputs, whose attention
  weights are identically 1) get exactly zero share and zero loss change;
- a block that is the whole perturbation follows the whole geodesic: its loss change is the
  value;
- the plot and the command line.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_sharpness_reuse import AttentionWithDiagonal
from torch import nn

import quotientsharp as qs
from quotientsharp.cli import main
from quotientsharp.engine import plot_blocks
from quotientsharp.models import QuotientBinding

#: These tests measure geodesic sharpness on MLPs, where discovery finds no symmetry: the
#: warning that says so is expected here (tests/test_symmetry_check.py checks it).
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


class OneBlockMatters(nn.Module):
    """``10 big(x) + small(x) + other(x)``: the loss is ten times as sensitive to ``big``."""

    def __init__(self) -> None:
        super().__init__()
        self.big, self.small, self.other = (nn.Linear(4, 2) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 10.0 * self.big(x) + self.small(x) + self.other(x)


def _regression(count: int = 2, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 4, generator=gen, dtype=torch.float64),
             torch.randn(8, 2, generator=gen, dtype=torch.float64)) for _ in range(count)]


def _by_name(records: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in records}


@pytest.mark.parametrize("measure, options", [
    ("worst_case", {"rho": 0.05}), ("worst_case", {"rho": 0.01, "p": "inf"}),
    ("adaptive", {"rho": 0.05}), ("geodesic", {"rho": 0.05, "other_path": "geodesic"})],
    ids=["worst-case", "box", "adaptive", "geodesic"])
def test_the_block_that_matters_carries_the_loss_change(measure, options) -> None:
    torch.manual_seed(0)
    model = OneBlockMatters().double()
    result = qs.sharpness(model, _regression(), measure=measure, loss="mse", n_iter=8,
                          blockwise=True, progress=False, **options)
    assert len(result.blocks) == 2
    for records, value in zip(result.blocks, result.per_batch, strict=True):
        assert [r["name"] for r in records] == [n for n, _ in model.named_parameters()]
        assert {r["kind"] for r in records} == {"parameter"}
        assert sum(r["norm_share"] for r in records) == pytest.approx(1.0, abs=1e-12)
        blocks = _by_name(records)
        big = blocks["big.weight"]["loss_change"] + blocks["big.bias"]["loss_change"]
        rest = sum(abs(r["loss_change"]) for r in records if not r["name"].startswith("big"))
        if options.get("p") != "inf":
            assert big > 0.8 * value and rest < 0.05 * value, records
            share = blocks["big.weight"]["norm_share"] + blocks["big.bias"]["norm_share"]
            assert share > 0.97, records
        else:
            # in a box every coordinate sits at its bound: the shares count coordinates, and
            # the loss changes are in proportion to the sensitivities, 10 : 1 : 1
            assert big > 0.75 * value and rest < 0.25 * value, records
            assert blocks["big.weight"]["norm_share"] == pytest.approx(8 / 30, rel=1e-12)
    summary = _by_name(result.block_summary())
    assert summary["big.weight"]["loss_change"] == pytest.approx(
        sum(_by_name(r)["big.weight"]["loss_change"] for r in result.blocks) / 2, rel=1e-12)


def test_heads_diagonal_pairs_and_parameters_in_geodesic_sharpness() -> None:
    torch.manual_seed(0)
    model = AttentionWithDiagonal().double().eval()
    gen = torch.Generator().manual_seed(1)
    # one token per example: the attention weights are identically 1, so the query/key pairs
    # cannot change the loss and the value/output pairs must carry the heads' part
    batches = [(torch.randn(6, 1, 4, generator=gen, dtype=torch.float64),
                torch.randint(0, 3, (6,), generator=gen))]
    result = qs.sharpness(model, batches, measure="geodesic", rho=0.05, metric="mix",
                          diagonal=[("u", "v")], n_iter=6, blockwise=True, progress=False)
    records = result.blocks[0]
    kinds = [r["kind"] for r in records]
    assert kinds[:4] == ["head"] * 4 and kinds[4] == "diagonal"
    assert set(kinds[5:]) == {"parameter"}
    blocks = _by_name(records)
    assert set(blocks) >= {"qk head 0", "qk head 1", "vo head 0", "vo head 1", "diagonal u * v",
                           "head.weight"}
    for head in ("qk head 0", "qk head 1"):
        assert blocks[head]["norm_share"] == 0.0 and blocks[head]["loss_change"] == 0.0
    assert blocks["vo head 0"]["loss_change"] > 0 and blocks["vo head 1"]["loss_change"] > 0
    # the shares agree with the per-kind norms of the result
    norms = result.perturbation_norms[0]
    total = norms["total"] ** 2
    for kind, label in (("head", "gl"), ("diagonal", "diagonal"), ("parameter", "other")):
        share = sum(r["norm_share"] for r in records if r["kind"] == kind)
        assert share == pytest.approx(norms[label] ** 2 / total, rel=1e-9, abs=1e-15)
    assert sum(r["norm_share"] for r in records) == pytest.approx(1.0, abs=1e-12)


class TwoDiagonalPairs(nn.Module):
    """``X[:, :3] (u1 * v1) + 5 X[:, 3:] (u2 * v2)``: two diagonal pairs, the second dominant."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.u1, self.v1, self.u2, self.v2 = (
            nn.Parameter(torch.rand(3, generator=gen, dtype=torch.float64) + 0.5)
            for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :3] @ (self.u1 * self.v1) + 5.0 * (x[:, 3:] @ (self.u2 * self.v2))


def test_diagonal_pairs_are_blocks_and_a_whole_perturbation_follows_its_geodesic() -> None:
    model = TwoDiagonalPairs()
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(10, 6, generator=gen, dtype=torch.float64),
                torch.randn(10, generator=gen, dtype=torch.float64))]
    options = dict(measure="geodesic", rho=0.1, metric="mix", loss="mse", n_iter=6,
                   blockwise=True, progress=False)
    result = qs.sharpness(model, batches, order="exact",
                          diagonal=[("u1", "v1"), ("u2", "v2")], **options)
    records = result.blocks[0]
    assert [r["name"] for r in records] == ["diagonal u1 * v1", "diagonal u2 * v2"]
    assert sum(r["norm_share"] for r in records) == pytest.approx(1.0, abs=1e-12)
    assert records[1]["norm_share"] > 0.9 and records[1]["loss_change"] > records[0][
        "loss_change"]
    # one pair only: the block is the whole perturbation, moved along the exact geodesic
    model.u2.requires_grad_(False)
    model.v2.requires_grad_(False)
    alone = qs.sharpness(model, batches, order="exact", diagonal=[("u1", "v1")], **options)
    (record,) = alone.blocks[0]
    assert record["norm_share"] == 1.0
    assert record["loss_change"] == pytest.approx(alone.per_batch[0], rel=1e-12)


def test_bindings_are_blocks() -> None:
    torch.manual_seed(1)
    model = AttentionWithDiagonal().double().eval()
    gen = torch.Generator().manual_seed(4)
    batches = [(torch.randn(6, 5, 4, generator=gen, dtype=torch.float64),
                torch.randint(0, 3, (6,), generator=gen))]
    binding = QuotientBinding(qs.DiagonalQuotient("inv"), ["u", "v"], name="gate")
    # the attention's heads are left to the adaptive block, and the warning says so
    with pytest.warns(qs.UnboundSymmetryWarning, match=r"7 other parameter\(s\) \(\['q_proj"):
        result = qs.sharpness(model, batches, measure="geodesic", rho=0.05, n_iter=4,
                              symmetries=[binding], blockwise=True, progress=False)
    records = result.blocks[0]
    assert records[0]["name"] == "gate" and records[0]["kind"] == "binding"
    norms = result.perturbation_norms[0]
    assert records[0]["norm_share"] == pytest.approx(norms["gate"] ** 2 / norms["total"] ** 2,
                                                     rel=1e-9)
    assert all(math.isfinite(r["loss_change"]) for r in records)


def test_plot_blocks_writes_a_figure(tmp_path) -> None:
    torch.manual_seed(0)
    model = OneBlockMatters().double()
    batches = _regression(count=1)
    result = qs.sharpness(model, batches, measure="adaptive", rho=0.05, loss="mse", n_iter=3,
                          blockwise=True, progress=False)
    path = plot_blocks(result, tmp_path / "figures" / "blocks.png", top=4)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain = qs.sharpness(model, batches, measure="adaptive", rho=0.05, loss="mse", n_iter=3,
                         progress=False)
    with pytest.raises(ValueError, match="blockwise=True"):
        plot_blocks(plain, tmp_path / "none.png")
    with pytest.raises(ValueError, match="top"):
        plot_blocks(result, tmp_path / "none.png", top=0)


def test_a_block_whose_loss_is_not_finite_reads_none_not_inf(tmp_path) -> None:
    # a block's part alone can overflow the network (a wide ball, nonfinite="skip"): no inf or
    # NaN in the records, the mean over the batches where it is finite, no bar in the plot
    from quotientsharp.cli.measure import blocks_table
    from quotientsharp.engine.blocks import Block, BlockOutcome

    blocks = [Block(name, "parameter", 0, (i,)) for i, name in enumerate(("a", "b", "c"))]
    batches = [BlockOutcome(blocks, torch.tensor([1.0, 1.0, 2.0]),
                            torch.tensor([0.5, math.inf, math.nan])),
               BlockOutcome(blocks, torch.tensor([1.0, 1.0, 2.0]),
                            torch.tensor([0.25, 2.0, math.inf]))]
    records = [outcome.records() for outcome in batches]
    assert [r["loss_change"] for r in records[0]] == [0.5, None, None]
    torch.manual_seed(0)
    result = qs.sharpness(OneBlockMatters().double(), _regression(count=2), measure="adaptive",
                          rho=0.05, loss="mse", n_iter=2, blockwise=True, progress=False)
    result.blocks = records
    summary = result.block_summary()
    assert [r["loss_change"] for r in summary] == [0.375, 2.0, None]
    assert [r["norm_share"] for r in summary] == [0.25, 0.25, 0.5]
    table = blocks_table("adaptive", summary)
    assert "not finite" in table.splitlines()[-1] and "inf" not in table and "nan" not in table
    path = plot_blocks(result, tmp_path / "blocks.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("blockwise-cli")
    torch.manual_seed(0)
    torch.save(OneBlockMatters(), root / "net.pt")
    gen = torch.Generator().manual_seed(0)
    torch.save((torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)),
               root / "data.pt")
    return root


def _measure(root, *arguments: str) -> int:
    # --n-iter without an ascent measure is refused: the average-only runs go without it
    steps = [] if arguments[:2] == ("--measure", "average") else ["--n-iter", "3"]
    return main(["measure", str(root / "net.pt"), str(root / "data.pt"), "--loss", "mse",
                 "--rho", "0.05", *steps, "--batch-size", "4", "--no-progress", *arguments])


def test_measure_command_reports_blocks_and_the_reference_gap(saved, tmp_path, capsys) -> None:
    out, figure = tmp_path / "out.json", tmp_path / "blocks.png"
    assert _measure(saved, "--measure", "adaptive,average", "--blockwise", "--plot",
                    str(figure), "--reference-n-iter", "6", "--reference-restarts", "1",
                    "--json", str(out)) == 0
    printed = capsys.readouterr().out
    assert "block-wise, adaptive" in printed and "norm share" in printed
    assert "big.weight" in printed and "reference solve (6 steps, 1 restart(s))" in printed
    assert figure.read_bytes()[:4] == b"\x89PNG"
    document = json.loads(out.read_text())
    assert document["settings"]["blockwise"] is True
    adaptive = document["results"]["adaptive"]
    assert len(adaptive["blocks"]) == 2 and len(adaptive["traces"]) == 2
    assert [r["name"] for r in adaptive["block_summary"]] == [
        "big.weight", "big.bias", "small.weight", "small.bias", "other.weight", "other.bias"]
    assert adaptive["gap"] == pytest.approx(adaptive["reference_value"] - adaptive["value"])
    assert adaptive["settings"]["reference_solve"]["n_iter"] == 6
    assert "blocks" not in document["results"]["average"]


@pytest.mark.parametrize("arguments, message", [
    (["--measure", "average", "--blockwise"], "--blockwise needs an ascent measure"),
    (["--measure", "average", "--compile-steps"], "--compile-steps needs an ascent measure"),
    (["--measure", "adaptive", "--plot", "x.png"], "--plot draws the loss change per block"),
    (["--measure", "adaptive", "--reference-n-iter", "0"], "--reference-n-iter must be"),
])
def test_measure_command_rejects_bad_solver_options(saved, capsys, arguments, message) -> None:
    assert _measure(saved, *arguments) == 2
    assert message in capsys.readouterr().err


def test_measure_command_compiles_the_solver_steps_on_request(saved, tmp_path) -> None:
    plain, compiled = tmp_path / "plain.json", tmp_path / "compiled.json"
    assert _measure(saved, "--measure", "adaptive", "--json", str(plain)) == 0
    assert _measure(saved, "--measure", "adaptive", "--compile-steps", "--json",
                    str(compiled)) == 0
    eager = json.loads(plain.read_text())["results"]["adaptive"]
    fast = json.loads(compiled.read_text())["results"]["adaptive"]
    assert fast["settings"]["compile_steps"] is True
    assert eager["settings"]["compile_steps"] is False
    # the same value to rounding (the compiled graphs sum the norms in another order)
    assert fast["value"] == pytest.approx(eager["value"], rel=1e-5, abs=0)


def test_measure_command_refuses_a_plot_format_matplotlib_cannot_write(saved, tmp_path,
                                                                       capsys) -> None:
    # matplotlib refused '.xyz' after the measurement, naming no option, and the --json
    # document was never written
    out = tmp_path / "out.json"
    assert _measure(saved, "--measure", "adaptive", "--blockwise", "--plot",
                    str(tmp_path / "blocks.xyz"), "--json", str(out)) == 2
    err = capsys.readouterr().err
    assert f"--plot {tmp_path / 'blocks.xyz'}: matplotlib writes no '.xyz' files" in err
    assert ".png" in err and ".svg" in err and err.count("\n") == 1
    assert not out.exists()


def test_measure_command_refuses_a_plot_path_without_a_suffix(saved, tmp_path, capsys) -> None:
    # matplotlib appended '.png': --json res.png --plot res wrote the plot to res.png, which
    # the JSON document then replaced, exit status 0
    out = tmp_path / "res.png"
    assert _measure(saved, "--measure", "adaptive", "--blockwise", "--plot",
                    str(tmp_path / "res"), "--json", str(out)) == 2
    err = capsys.readouterr().err
    assert f"--plot {tmp_path / 'res'}: it has no suffix; end the path with one of" in err
    assert not out.exists()


def test_measure_command_refuses_one_file_for_two_outputs(saved, tmp_path, capsys) -> None:
    # --plot same.png --json same.png: the JSON document replaced the plot, exit status 0
    same = tmp_path / "same.png"
    assert _measure(saved, "--measure", "adaptive", "--blockwise", "--plot", str(same),
                    "--json", str(tmp_path / "." / "same.png")) == 2
    err = capsys.readouterr().err
    assert "are the same file: one output would replace the other" in err
    assert "--json" in err and "--plot" in err and err.count("\n") == 1
    assert not same.exists()
