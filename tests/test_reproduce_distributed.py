"""``quotientsharp reproduce`` under torchrun: two gloo ranks give the single-process records.

The studies run through ``python -m torch.distributed.run --nproc_per_node 2 ... -m
quotientsharp reproduce STUDY`` (2 CPU processes, gloo, 127.0.0.1 and a free port, as in
as every torchrun test of this file), and the same settings run in this process through
``quotientsharp.cli.main``. The per-model records must be equal bit for bit (timings aside):
every number of a model depends on its index only, never on the rank that computed it or on
the models computed before it in the same process. Then ``--resume`` without torchrun must
recompute nothing, and an interrupted distributed run (records left in per-rank shards, a torn
last line) must resume to the same records, computing exactly the missing model.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from quotientsharp.cli import main
from quotientsharp.reproduce.invariance import study as invariance
from quotientsharp.workflows import files as common
from quotientsharp.workflows.files import read_jsonl
from quotientsharp.workflows.process_group import (
    gather_indexed,
    init_distributed,
    run_on_rank0,
    shard,
    torchrun_world_size,
)
from quotientsharp.workflows.records import ResultsDirectory, shard_name, shard_paths
from tests.pages.docs_folder import docs_with_renderer

if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available: torchrun cannot run",
                allow_module_level=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun(*argv: str, ranks: int = 2) -> subprocess.CompletedProcess:
    """``quotientsharp reproduce ...`` under torchrun with ``ranks`` CPU processes."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", str(ranks), "--master_addr", "127.0.0.1", "--master_port",
               str(_free_port()), "-m", "quotientsharp", "reproduce", *argv]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["reproduce", *argv])
    return code, out.getvalue(), err.getvalue()


def _two_ranks_and_one(root: Path, study: Sequence[str], *ranked: str
                        ) -> subprocess.CompletedProcess:
    """``study`` under torchrun into ``root/ranks2`` (with ``ranked`` arguments) and in this
    process into ``root/single``; returns the torchrun process."""
    launched = _torchrun(*study, "--out", str(root / "ranks2"), *ranked)
    assert launched.returncode == 0, launched.stderr[-4000:]
    code, _, stderr = _cli(*study, "--out", str(root / "single"))
    assert code == 0, stderr
    return launched


def _without_timings(record: dict) -> dict:
    return {key: value for key, value in record.items() if not key.endswith("seconds")}


def _run_info(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


# ---------------------------------------------------------------------------- diagonal
DIAGONAL = ("diagonal", "--quick", "--nets", "3", "--no-plots", "--no-progress")


def _page(folder: Path) -> dict:
    """What the page of the run in ``folder`` shows (its ``page.json``)."""
    return json.loads((folder / "page.json").read_text())["page"]


@pytest.fixture(scope="module")
def diagonal_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diagonal")
    return root, _two_ranks_and_one(root, DIAGONAL, "--docs",
                                    str(docs_with_renderer(root / "docs")))


@pytest.mark.study
def test_diagonal_two_ranks_give_the_single_process_files(diagonal_runs):
    root, launched = diagonal_runs
    two, one = root / "ranks2", root / "single"
    # the nets train on rank 0 in one batch, the measures are dealt over the ranks: the
    # values are bit-identical, so the files are too (no timing is stored in them)
    for name in ("models.jsonl", "trained.jsonl", "models.csv"):
        assert (two / name).read_text() == (one / name).read_text(), name
    assert read_jsonl(two / "models.jsonl") == read_jsonl(one / "models.jsonl")
    assert _run_info(two)["taus"] == _run_info(one)["taus"]
    assert _run_info(two)["world_size"] == 2 and _run_info(one)["world_size"] == 1
    # the page data of the results folder says how the run was made
    assert _page(two)["world_size"] == 2 and _page(one)["world_size"] == 1
    assert "2 ranks under torchrun" in (root / "docs" / "results" / "diagonal.md").read_text()
    # only rank 0 reports
    assert launched.stdout.count("nets counted") == 1


@pytest.mark.study
def test_diagonal_resume_of_a_distributed_run_recomputes_nothing(diagonal_runs):
    root, _ = diagonal_runs
    two = root / "ranks2"
    before = {name: (two / name).read_text() for name in ("models.jsonl", "trained.jsonl")}
    code, _, stderr = _cli(*DIAGONAL, "--out", str(two), "--resume")
    assert code == 0, stderr
    info = _run_info(two)
    assert info["trained_now"] == [] and info["measured_now"] == []
    assert info["world_sizes"] == [2, 1] and info["resumed"] == 1
    assert {name: (two / name).read_text() for name in before} == before


# ---------------------------------------------------------------------------- a family study
VIT = ("vit", "--quick", "--models", "2", "--no-plots", "--no-progress")


@pytest.fixture(scope="module")
def vit_runs(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("sklearn")
    root = tmp_path_factory.mktemp("vit")
    return root, _two_ranks_and_one(root, VIT)


@pytest.mark.study
def test_vit_two_ranks_give_the_single_process_records(vit_runs):
    root, launched = vit_runs
    two, one = root / "ranks2", root / "single"
    ours, single = read_jsonl(two / "models.jsonl"), read_jsonl(one / "models.jsonl")
    # model 0 trained and measured on rank 0, model 1 on rank 1: equal bit for bit
    assert [r["index"] for r in ours] == [0, 1]
    assert [_without_timings(r) for r in ours] == [_without_timings(r) for r in single]
    assert json.loads((two / "taus.json").read_text()) == json.loads(
        (one / "taus.json").read_text())
    assert shard_paths(two, "models.jsonl") == []          # folded into models.jsonl
    info = _run_info(two)
    assert info["status"] == "finished" and info["world_size"] == 2
    assert info["computed_now"] == [0, 1]
    assert _page(two)["world_size"] == 2
    assert launched.stdout.count("computed now:") == 1


@pytest.mark.study
def test_vit_resume_after_a_distributed_run_recomputes_nothing(vit_runs, monkeypatch):
    root, _ = vit_runs
    two = root / "ranks2"
    before = (two / "models.jsonl").read_text()

    def refuse(*args, **kwargs):
        raise AssertionError("a finished model was computed again on --resume")

    monkeypatch.setattr(common_family(), "train_classifier", refuse)
    monkeypatch.setattr(common_family(), "measure_model", refuse)
    code, stdout, stderr = _cli(*VIT, "--out", str(two), "--resume")
    assert code == 0, stderr
    assert "computed now: 0 model(s)" in stdout
    assert (two / "models.jsonl").read_text() == before
    assert _run_info(two)["world_sizes"] == [2, 1]


@pytest.mark.study
def test_interrupted_distributed_run_resumes_to_the_same_records(vit_runs):
    root, _ = vit_runs
    two, one = root / "ranks2", root / "single"
    folder = root / "interrupted"
    shutil.copytree(two, folder)
    finished = read_jsonl(two / "models.jsonl")
    # as an interrupted 2-rank run leaves it: rank 1 finished model 1, rank 0 was writing
    # model 0 when it stopped (a torn line), nothing was folded into models.jsonl yet
    (folder / "models.jsonl").unlink()
    (folder / shard_name("models.jsonl", 1)).write_text(json.dumps(finished[1]) + "\n")
    (folder / shard_name("models.jsonl", 0)).write_text(json.dumps(finished[0])[:50])
    info = _run_info(folder)
    info.update(status="running", finished_models=1)
    (folder / "run.json").write_text(json.dumps(info))
    code, stdout, stderr = _cli(*VIT, "--out", str(folder), "--resume")
    assert code == 0, stderr
    assert _run_info(folder)["computed_now"] == [0]
    assert shard_paths(folder, "models.jsonl") == []
    records = read_jsonl(folder / "models.jsonl")
    assert [r["index"] for r in records] == [1, 0]
    assert records[0] == finished[1]                         # kept as it was, timings too
    single = read_jsonl(one / "models.jsonl")
    assert _without_timings(records[1]) == _without_timings(single[0])


def common_family():
    """The module whose ``train_classifier`` and ``measure_model`` family_study calls."""
    from quotientsharp.reproduce.families import run as family_run

    return family_run


# ---------------------------------------------------------------------------- in one process
def test_torchrun_world_size_reads_the_environment():
    assert torchrun_world_size({}) == 1
    assert torchrun_world_size({"WORLD_SIZE": "4"}) == 1             # RANK missing
    assert torchrun_world_size({"RANK": "1", "WORLD_SIZE": "4"}) == 4
    assert torchrun_world_size({"RANK": "0", "WORLD_SIZE": "1"}) == 1
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        torchrun_world_size({"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        torchrun_world_size({"RANK": "0", "WORLD_SIZE": "0"})


def test_run_on_rank0_without_a_process_group_is_a_call():
    assert run_on_rank0(lambda: 7) == 7
    with pytest.raises(KeyError):
        run_on_rank0(lambda: {}["missing"])


def test_shard_deals_round_robin_and_covers_everything(monkeypatch):
    from quotientsharp.workflows import process_group

    items = list("abcdefg")
    assert shard(items) == list(enumerate(items))       # no process group: everything
    shares = []
    for rank in range(3):
        monkeypatch.setattr(process_group, "rank_and_world_size", lambda rank=rank: (rank, 3))
        shares.append(shard(items))
    assert shares[0] == [(0, "a"), (3, "d"), (6, "g")]
    assert shares[2] == [(2, "c"), (5, "f")]
    assert sorted(i for share in shares for i, _ in share) == list(range(7))


def test_shard_rejects_non_sequences():
    for items in (torch.zeros(3), iter([1, 2]), {0: "a"}, "ab"):
        with pytest.raises(TypeError, match="sequence"):
            shard(items)


def test_gather_indexed_orders_and_checks_indices():
    assert gather_indexed([(2, "c"), (0, "a"), (1, "b")]) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="exactly once"):
        gather_indexed([(0, "a"), (2, "c")])


def test_init_distributed_without_torchrun_says_how(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="torchrun"):
        init_distributed()


def test_shard_files_are_named_found_merged_and_folded(tmp_path):
    assert shard_name("models.jsonl", 3) == "models.rank3.jsonl"
    with pytest.raises(ValueError, match="rank"):
        shard_name("models.jsonl", -1)
    folder = ResultsDirectory(tmp_path / "out", "demo", {"a": 1}, resume=False,
                              owned=["models.jsonl"], sharded=["models.jsonl"])
    folder.append("models.jsonl", {"index": 2, "v": 0.5})
    for rank, index in ((10, 3), (1, 0), (1, 2)):
        common.append_jsonl(folder.path / shard_name("models.jsonl", rank),
                            {"index": index, "v": rank})
    (folder.path / "models.rankx.jsonl").write_text("not a shard\n")
    assert [p.name for p in shard_paths(folder.path, "models.jsonl")] == [
        "models.rank1.jsonl", "models.rank10.jsonl"]
    # the file's own record of index 2 wins over the shard's duplicate
    assert folder.merged_records("models.jsonl", "index") == [
        {"index": 2, "v": 0.5}, {"index": 0, "v": 1}, {"index": 3, "v": 10}]
    merged = folder.consolidate("models.jsonl", "index")
    assert [r["index"] for r in merged] == [0, 2, 3]
    assert read_jsonl(folder.file("models.jsonl")) == merged
    assert shard_paths(folder.path, "models.jsonl") == []
    # without shards nothing is rewritten (a single-process file keeps its order)
    folder.append("models.jsonl", {"index": 1, "v": 0.0})
    text = folder.file("models.jsonl").read_text()
    folder.consolidate("models.jsonl", "index")
    assert folder.file("models.jsonl").read_text() == text
    # a fresh run deletes the shards of an earlier one; --resume refuses them without run.json
    common.append_jsonl(folder.path / shard_name("models.jsonl", 4), {"index": 9})
    ResultsDirectory(folder.path, "demo", {"a": 1}, resume=False, owned=["models.jsonl"],
                     sharded=["models.jsonl"])
    assert shard_paths(folder.path, "models.jsonl") == []
    (folder.path / "run.json").unlink()
    common.append_jsonl(folder.path / shard_name("models.jsonl", 4), {"index": 9})
    with pytest.raises(ValueError, match="no run.json"):
        ResultsDirectory(folder.path, "demo", {"a": 1}, resume=True, owned=["models.jsonl"],
                         sharded=["models.jsonl"])


class _FakeTokenizer:
    def __call__(self, sentences, padding, return_tensors):
        return {"input_ids": torch.zeros(len(sentences), 3, dtype=torch.long)}


def _fake_invariance(monkeypatch, calls: list) -> None:
    """MiniLM and the sharpness engine replaced by cheap deterministic stand-ins."""
    import quotientsharp.models

    monkeypatch.setattr(invariance, "load_minilm", lambda seed: (1.0, _FakeTokenizer()))
    monkeypatch.setattr(quotientsharp.models, "find_symmetries", lambda model: None)
    monkeypatch.setattr(invariance, "_moved_model",
                        lambda model, report, scale, generator: (scale, 2.0 + scale))
    monkeypatch.setattr(invariance, "_logits", lambda model, batch: torch.zeros(2))

    def measure(subject, batch, n_iter, measures):
        calls.append(subject)
        return {key: {"value": 0.1 * (k + 1) * (1.0 + subject) ** 0.5, "clean": 0.5,
                      "geometry": "float64", "kept": 1.0, "seconds": 0.0}
                for k, (key, _, _) in enumerate(measures)}

    monkeypatch.setattr(invariance, "_measure", measure)


def test_invariance_resumes_from_the_shards_of_a_distributed_run(tmp_path, monkeypatch):
    calls: list = []
    _fake_invariance(monkeypatch, calls)
    reference = invariance.invariance_study(tmp_path / "reference", quick=True, plots=False,
                                            dtypes="float64")
    assert len(calls) == len(invariance.QUICK.grid) + 1
    points = read_jsonl(tmp_path / "reference" / "float64" / "points.jsonl")
    top = tmp_path / "interrupted"
    folder = top / "float64"         # each precision's run has its own folder
    folder.mkdir(parents=True)
    info = _run_info(tmp_path / "reference" / "float64")
    info.update(status="running")
    (folder / "run.json").write_text(json.dumps(info))

    def raw(record):
        # as a rank appends it: the changes are only added once the original is gathered
        return {k: v for k, v in record.items()
                if not k.startswith("change_") and k != "clean_loss_change"}

    # rank 0 finished the original and point 1, rank 1 point 0, point 2 is missing
    by_point = {r["point"]: r for r in points}
    (folder / shard_name("points.jsonl", 0)).write_text(
        "".join(json.dumps(raw(by_point[p])) + "\n" for p in (-1, 1)))
    (folder / shard_name("points.jsonl", 1)).write_text(json.dumps(raw(by_point[0])) + "\n"
                                                        + json.dumps(raw(by_point[2]))[:30])
    calls.clear()
    resumed = invariance.invariance_study(top, quick=True, resume=True, plots=False,
                                          dtypes="float64")
    assert resumed.computed_now == {"float64": [2]} and len(calls) == 1
    assert shard_paths(folder, "points.jsonl") == []
    merged = {r["point"]: r for r in read_jsonl(folder / "points.jsonl")}
    expected = {r["point"]: r for r in points}
    # the kept points are as the shards hold them (timings too) with the changes restored; the
    # recomputed point differs from the reference run in its timing only
    assert {p: merged[p] for p in (-1, 0, 1)} == {p: expected[p] for p in (-1, 0, 1)}
    assert _without_timings(merged[2]) == _without_timings(expected[2])
    assert [list(merged[p]) for p in sorted(merged)] == [list(r) for r in points]
    assert [_without_timings(r) for r in resumed.points["float64"]] == [
        _without_timings(r) for r in reference.points["float64"]]
    assert _csv_without_timings(folder / "invariance.csv") == _csv_without_timings(
        tmp_path / "reference" / "float64" / "invariance.csv")


def _csv_without_timings(path: Path) -> list[list[str]]:
    rows = [line.split(",") for line in path.read_text().splitlines()]
    keep = [k for k, column in enumerate(rows[0]) if not column.endswith("seconds")]
    return [[row[k] for k in keep] for row in rows]


GLOO_TIMEOUT = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                "waiting 1800000ms for recv operation to complete")


def test_collective_failures_are_described():
    from quotientsharp.workflows.process_group import describe_collective_failure

    timed_out = describe_collective_failure(RuntimeError(GLOO_TIMEOUT), 1800.0)
    assert "timed out waiting for the other ranks" in timed_out
    assert "--dist-timeout 1800 s" in timed_out and "--resume" in timed_out
    assert GLOO_TIMEOUT in timed_out
    lost = describe_collective_failure(RuntimeError("[gloo] Connection closed by peer "
                                                    "[127.0.0.1]:1234"))
    assert "lost contact with another rank" in lost and "--resume" in lost
    assert describe_collective_failure(RuntimeError("shape mismatch")) is None
