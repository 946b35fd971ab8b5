"""``quotientsharp study MANIFEST``: the paper's workflow on saved models, end to end.

Five small MLPs saved with ``torch.save`` and made-up gaps, and three tiny BERTs saved with
``save_pretrained`` whose gap is computed from train and test JSON lines, are studied through
``quotientsharp.cli.main``. Checked: the CSV against direct ``quotientsharp.sharpness`` calls,
the taus against the Kendall functions, the bootstrap against resampling by hand, the report
and plot files; an interrupted run (stopped after 2 models, in this process and by SIGKILL in a
subprocess) resumed to the very files of an uninterrupted one; a grown manifest; torchrun with
2 gloo ranks; bad manifests rejected in one line.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from quotientsharp import sharpness
from quotientsharp.cli import main
from quotientsharp.workflows import measuring
from quotientsharp.workflows.files import read_jsonl
from quotientsharp.workflows.taus import kendall_tau_a, kendall_tau_b

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GAPS = [0.30, 0.05, 0.20, 0.10, 0.40]
GRID = ("--measure", "adaptive", "--measure", "geodesic", "--rho", "0.05,0.1",
        "--metric", "inv,mix", "--order", "1,2")
#: A grid of two points, for the runs in subprocesses (whose imports cost most of their time).
SMALL = ("--measure", "adaptive,geodesic", "--metric", "mix", "--rho", "0.1")
OPTIONS = ("--n-iter", "3", "--batch-size", "8", "--no-progress", "--bootstrap", "200")
KEYS = ["adaptive_rho0.05", "adaptive_rho0.1"] + [
    f"geodesic_{metric}_order{order}_rho{rho}" for metric in ("inv", "mix")
    for order in (1, 2) for rho in ("0.05", "0.1")]


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.mul_(0.5 + 0.4 * seed)
    return net


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Five MLPs (torch.save), a tensor data file and a CSV manifest with gaps and a column."""
    root = tmp_path_factory.mktemp("study")
    (root / "nets").mkdir()
    for index in range(5):
        torch.save(_mlp(index), root / "nets" / f"net{index}.pt")
    generator = torch.Generator().manual_seed(0)
    torch.save((torch.randn(20, 5, generator=generator),
                torch.randint(0, 3, (20,), generator=generator)), root / "data.pt")
    lines = ["model,gap,learning_rate"] + [f"nets/net{i}.pt,{GAPS[i]},{10.0 ** -i}"
                                           for i in range(5)]
    (root / "models.csv").write_text("\n".join(lines) + "\n")
    return root


def _study(saved: Path, out: Path, *extra: str, manifest: str = "models.csv",
           grid: tuple[str, ...] = GRID) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    # an option in extra replaces the one of OPTIONS: an option given twice is an error
    given, options, keep = set(extra), [], True
    for item in OPTIONS:
        keep = item not in given if item.startswith("--") else keep
        options += [item] if keep else []
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["study", str(saved / manifest), "--data", str(saved / "data.pt"), *grid,
                     *options, "--out", str(out), *extra])
    return code, stdout.getvalue(), stderr.getvalue()


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def full_run(saved) -> tuple[Path, str]:
    out = saved / "full"
    code, stdout, stderr = _study(saved, out, "--color", "learning_rate")
    assert code == 0, stderr
    return out, stdout


@pytest.fixture(scope="module")
def small_run(saved) -> Path:
    """The study on the grid :data:`SMALL`, uninterrupted, in this process."""
    out = saved / "small"
    code, _, stderr = _study(saved, out, "--no-plots", grid=SMALL)
    assert code == 0, stderr
    return out


# ---------------------------------------------------------------------------- one run
# the MLPs have no symmetry discovery knows: the direct calls warn that geodesic equals
# adaptive (the study itself prints it as a note, checked below)
@pytest.mark.study
@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_csv_rows_hold_the_gaps_and_the_engines_values(saved, full_run):
    out, stdout = full_run
    rows = _rows(out / "models.csv")
    assert [row["name"] for row in rows] == [f"nets/net{i}.pt" for i in range(5)]
    assert stdout.count("no symmetry was found or bound, so geodesic sharpness equals") == 5
    assert list(rows[0]) == ["name", "model", "gap", "gap_from", "learning_rate",
                             "clean_loss", *KEYS]
    assert [float(row["gap"]) for row in rows] == GAPS
    assert {row["gap_from"] for row in rows} == {"manifest"}
    data = torch.load(saved / "data.pt")
    batches = [(data[0][i:i + 8], data[1][i:i + 8]) for i in range(0, 20, 8)]
    for index in (0, 3):
        model = torch.load(saved / "nets" / f"net{index}.pt", weights_only=False)
        direct = sharpness(model, batches, measure="geodesic", rho=0.05, metric="mix", order=1,
                           n_iter=3, progress=False)
        assert float(rows[index]["geodesic_mix_order1_rho0.05"]) == direct.value
    records = read_jsonl(out / "models.jsonl")
    assert len(records) == 5 and all(len(r["per_batch"][KEYS[0]]) == 3 for r in records)


@pytest.mark.study
def test_taus_and_intervals(full_run):
    out, stdout = full_run
    rows = _rows(out / "models.csv")
    taus = json.loads((out / "taus.json").read_text())
    assert [row["key"] for row in taus] == KEYS
    for row in taus:
        values = [float(r[row["key"]]) for r in rows]
        assert row["tau_a"] == kendall_tau_a(GAPS, values)
        assert row["tau_b"] == pytest.approx(kendall_tau_b(GAPS, values), abs=1e-12)
        assert row["count"] == 5 and row["resamples"] == 200
        for name in ("tau_a", "tau_b"):
            assert -1 <= row[f"{name}_low"] <= row[f"{name}_high"] <= 1
    assert taus[1]["label"] == "adaptive sharpness (rho = 0.1)"
    assert len(_rows(out / "taus.csv")) == len(KEYS)
    # the console: the table with readable names, the sign convention, the report
    assert "geodesic sharpness (mix metric, order 2, rho = 0.05)" in stdout
    assert "Positive tau: sharpness and the generalisation gap rank alike" in stdout
    assert str(out / "report.md") in stdout


@pytest.mark.study
def test_report_and_plots(full_run):
    out, _ = full_run
    report = (out / "report.md").read_text()
    assert "| geodesic sharpness (inv metric, order 1, rho = 0.1) | 5 |" in report
    assert "95% interval" in report and "bootstrap" in report
    assert "quotientsharp study" in report and "--rho 0.05,0.1" in report
    images = [line[line.index("](") + 2:-1] for line in report.splitlines()
              if line.startswith("![")]
    assert sorted(images) == sorted(f"scatter_{key}.png" for key in KEYS)
    for image in images:
        assert (out / image).read_bytes()[:8] == PNG_MAGIC


@pytest.mark.study
def test_plots_of_an_earlier_run_are_removed(saved, tmp_path):
    """A new run (another grid, or ``--no-plots``) in a folder that holds plots leaves none
    of the old ones: their titles and points are of other data."""
    out = tmp_path / "replotted"
    assert _study(saved, out, grid=SMALL)[0] == 0
    old = sorted(path.name for path in out.glob("scatter_*"))
    assert "scatter_adaptive_rho0.1.png" in old and "scatter_panels.svg" in old
    other = ("--measure", "adaptive", "--rho", "0.05")
    assert _study(saved, out, grid=other)[0] == 0
    assert sorted(path.name for path in out.glob("scatter_*")) == [
        "scatter_adaptive_rho0.05.png", "scatter_adaptive_rho0.05.svg"]
    assert _study(saved, out, "--no-plots", "--resume", grid=other)[0] == 0
    assert not list(out.glob("scatter_*"))


# ---------------------------------------------------------------------------- interrupted
def _stop_after(monkeypatch, models: int) -> None:
    """Make the run stop (KeyboardInterrupt) when model ``models + 1`` starts."""
    calls = []
    original = measuring.measure_entry

    def measure_entry(*args, **kwargs):
        if len(calls) == models:
            raise KeyboardInterrupt
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(measuring, "measure_entry", measure_entry)


@pytest.mark.study
def test_interrupted_run_resumes_to_the_files_of_an_uninterrupted_one(saved, small_run,
                                                                      monkeypatch):
    out = saved / "interrupted"
    with monkeypatch.context() as patch:
        _stop_after(patch, 2)
        code, _, stderr = _study(saved, out, "--no-plots", grid=SMALL)
    assert code == 130 and "--resume" in stderr
    assert len(_rows(out / "models.csv")) == 2 and len(read_jsonl(out / "models.jsonl")) == 2
    code, stdout, stderr = _study(saved, out, "--no-plots", "--resume", grid=SMALL)
    assert code == 0, stderr
    assert "measured now: 3" in stdout
    for name in ("models.csv", "taus.json", "taus.csv"):
        assert (out / name).read_bytes() == (small_run / name).read_bytes(), name
    run = json.loads((out / "run.json").read_text())
    assert run["resumed"] == 1 and run["status"] == "finished"


@pytest.mark.study
def test_the_search_and_nonfinite_options_are_part_of_a_runs_settings(saved):
    # both can change the values: run.json keeps them (only when given, so that the run.json
    # of a study without them still resumes), resume checks them, the report names them
    out = saved / "searched"
    code, _, stderr = _study(saved, out, "--no-plots", "--chains", "3", "--nonfinite", "skip",
                             grid=SMALL)
    assert code == 0, stderr
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["chains"] == 3 and settings["nonfinite"] == "skip"
    assert "--chains 3 --nonfinite skip" in (out / "report.md").read_text()
    code, _, stderr = _study(saved, out, "--no-plots", "--resume", "--chains", "4",
                             "--nonfinite", "skip", grid=SMALL)
    assert code == 2 and "chains" in stderr
    default = saved / "default_search"
    assert _study(saved, default, "--no-plots", grid=SMALL)[0] == 0
    assert not {"chains", "nonfinite"} & set(
        json.loads((default / "run.json").read_text())["settings"])


@pytest.mark.study
def test_killed_subprocess_loses_no_finished_model(saved, small_run):
    """SIGKILL in the middle of the third model: no cleanup runs, the two finished models are
    on disk, and --resume completes the same files."""
    out = saved / "killed"
    argv = ["study", str(saved / "models.csv"), "--data", str(saved / "data.pt"), *SMALL,
            *OPTIONS, "--out", str(out), "--no-plots"]
    script = textwrap.dedent(f"""
        import os, signal
        from quotientsharp.cli import main
        from quotientsharp.workflows import measuring
        original, calls = measuring.measure_entry, []
        def measure_entry(*args, **kwargs):
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            calls.append(1)
            return original(*args, **kwargs)
        measuring.measure_entry = measure_entry
        main({argv!r})
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)
    assert done.returncode == -9, done.stderr[-2000:]
    assert len(read_jsonl(out / "models.jsonl")) == 2
    assert len(_rows(out / "models.csv")) == 2
    code, _, stderr = _study(saved, out, "--no-plots", "--resume", grid=SMALL)
    assert code == 0, stderr
    for name in ("models.csv", "taus.json"):
        assert (out / name).read_bytes() == (small_run / name).read_bytes(), name


@pytest.mark.study
def test_the_library_runs_the_study_of_the_command_line(saved, small_run):
    """``run_study(manifest, StudyConfig(...))`` without a command line writes the files of
    ``quotientsharp study`` with the same settings."""
    from quotientsharp.workflows import StudyConfig, run_study
    from quotientsharp.workflows.options import (
        BatchSettings,
        BootstrapSettings,
        SolverSettings,
    )

    out = saved / "library"
    outcome = run_study(saved / "models.csv", StudyConfig(
        data=saved / "data.pt", measures=["adaptive", "geodesic"], metrics=["mix"], rho=0.1,
        out=out, batches=BatchSettings(batch_size=8), solver=SolverSettings(n_iter=3),
        bootstrap=BootstrapSettings(resamples=200), progress=False, plots=False))
    assert outcome.out == out and len(outcome.rows) == 5 and len(outcome.computed_now) == 5
    assert outcome.plots is None
    for name in ("models.csv", "taus.json", "taus.csv"):
        assert (out / name).read_bytes() == (small_run / name).read_bytes(), name
    settings = [json.loads((folder / "run.json").read_text())["settings"]
                for folder in (out, small_run)]
    assert settings[0] == settings[1]


def test_a_study_config_checks_and_normalises_itself():
    from quotientsharp.workflows import StudyConfig
    from quotientsharp.workflows.options import InputError

    config = StudyConfig(data="data.pt", measures="worst-case,geodesic", rho=1, p=2,
                         orders=["1", 2, "exact"], eps=0)
    assert config.measures == ("worst_case", "geodesic") and config.radii == (1.0,)
    assert config.p == "2" and config.orders == (1, 2, "exact") and config.eps == 0.0
    assert config.gap_kind == "error"
    for fields, message in (({}, "rho is required for geodesic"),
                            ({"rho": -0.1}, "rho must be a finite number > 0, got -0.1"),
                            ({"rho": 0.1, "orders": [3]}, "orders must be 1, 2 or 'exact'"),
                            ({"rho": 0.1, "measures": ["sam"]}, "unknown measure 'sam'"),
                            ({"rho": 0.1, "threads": 0}, "threads must be an integer >= 1, got 0")):
        with pytest.raises(InputError, match=message):
            StudyConfig(data="data.pt", **fields)


@pytest.mark.study
def test_a_grown_manifest_measures_only_the_new_model(saved):
    out = saved / "grown"
    short = saved / "short.csv"
    short.write_text("\n".join((saved / "models.csv").read_text().splitlines()[:4]) + "\n")
    assert _study(saved, out, "--no-plots", manifest="short.csv")[0] == 0
    code, stdout, stderr = _study(saved, out, "--no-plots", "--resume")
    assert code == 0, stderr
    assert "5 models, measured now: 2" in stdout
    assert len(_rows(out / "models.csv")) == 5
    # the settings that determine the values must not change on --resume
    code, _, stderr = _study(saved, out, "--no-plots", "--resume", "--n-iter", "4")
    assert code == 2 and "settings differ" in stderr and stderr.count("\n") == 1


# ---------------------------------------------------------------------------- HuggingFace
@pytest.mark.study
def test_hf_models_with_train_and_test_data(tmp_path):
    transformers = pytest.importorskip("transformers")
    generator = torch.Generator().manual_seed(0)
    for name in ("train", "test", "sharp"):
        with (tmp_path / f"{name}.jsonl").open("w") as handle:
            for row in range(8):
                length = int(torch.randint(3, 9, (1,), generator=generator))
                ids = torch.randint(1, 30, (length,), generator=generator).tolist()
                handle.write(json.dumps({"input_ids": ids, "label": row % 2}) + "\n")
    with (tmp_path / "bert.jsonl").open("w") as handle:
        for index in range(3):
            torch.manual_seed(index)
            config = transformers.BertConfig(
                hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=32, vocab_size=30, max_position_embeddings=16, num_labels=2,
                attn_implementation="eager", initializer_range=0.2 * (index + 1))
            transformers.BertForSequenceClassification(config).save_pretrained(
                tmp_path / f"bert{index}")
            handle.write(json.dumps({"model": f"bert{index}", "name": f"b{index}",
                                     "train": "train.jsonl", "test": "test.jsonl"}) + "\n")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["study", str(tmp_path / "bert.jsonl"), "--data",
                     str(tmp_path / "sharp.jsonl"), "--measure", "geodesic", "--metric",
                     "mix", "--rho", "0.1", "--n-iter", "2", "--batch-size", "4",
                     "--out", str(tmp_path / "out"), "--no-progress", "--no-plots"])
    assert code == 0
    rows = _rows(tmp_path / "out" / "models.csv")
    assert [row["name"] for row in rows] == ["b0", "b1", "b2"]
    assert {row["gap_from"] for row in rows} == {"test error - train error"}
    # the gap by hand: 0-1 errors of one plain forward per example
    model = transformers.BertForSequenceClassification.from_pretrained(
        tmp_path / "bert1", attn_implementation="eager").eval()
    errors = {}
    for split in ("train", "test"):
        wrong = 0
        for line in (tmp_path / f"{split}.jsonl").read_text().splitlines():
            row = json.loads(line)
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([row["input_ids"]])).logits
            wrong += int(logits.argmax(-1).item() != row["label"])
        errors[split] = wrong / 8
        assert float(rows[1][f"{split}_error"]) == errors[split]
    assert float(rows[1]["gap"]) == errors["test"] - errors["train"]
    assert float(rows[1]["geodesic_mix_order2_rho0.1"]) > 0


# ---------------------------------------------------------------------------- torchrun
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.study
@pytest.mark.skipif(not (torch.distributed.is_available()
                         and torch.distributed.is_gloo_available()),
                    reason="torch.distributed with gloo is not available")
def test_two_ranks_write_the_single_process_files(saved, small_run):
    out = saved / "ranks2"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
               str(_free_port()), "-m", "quotientsharp", "study", str(saved / "models.csv"),
               "--data", str(saved / "data.pt"), *SMALL, *OPTIONS, "--out", str(out),
               "--no-plots", "--threads", "1"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("measured now: 5") == 1              # rank 0 alone prints
    for name in ("models.csv", "taus.json"):
        assert (out / name).read_bytes() == (small_run / name).read_bytes(), name
    assert not list(out.glob("models.rank*.jsonl"))
    assert json.loads((out / "run.json").read_text())["world_size"] == 2


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("manifest", "message"), [
    ("gap\n0.1\n0.2\n", "no 'model' entry"),
    ("model,gap\nnets/net0.pt,0.1\n", "needs at least 2"),
    ("model,gap\nnets/net0.pt,0.1\nnets/nope.pt,0.2\n", "does not exist"),
    ("model,gap\nnets/net0.pt,0.1\nnets/net1.pt,\n", "no 'gap' and no 'train'"),
    ("model,gap,train,test\nnets/net0.pt,0.1,data.pt,data.pt\nnets/net1.pt,0.2,,\n",
     "both a 'gap' and 'train'/'test'"),
    ("model,gap,name\nnets/net0.pt,0.1,a\nnets/net1.pt,0.2,a\n", "already used on line 2"),
    ("model,gap,name\nnets/net0.pt,0.1,\u00e9\nnets/net1.pt,0.2,e\u0301\n",
     "already used on line 2 (there in another Unicode form of the same text)"),
    ("model,gap\nnets/net0.pt,0.1\nnets/net1.pt,high\n", "gap must be a number"),
    ("model,gap,clean_loss\nnets/net0.pt,0.1,1\nnets/net1.pt,0.2,2\n", "output columns"),
    # a quoted value over two lines: zip's 'argument 2 is shorter than argument 1' was all
    ('model,gap,note\nnets/net0.pt,0.1,"two\nlines"\nnets/net1.pt,0.2,x\n',
     "line 2: a quoted value is not closed on its line"),
    ('model,gap,note\nnets/net0.pt,0.1,"unclosed\nnets/net1.pt,0.2,x\n',
     "line 2: a quoted value is not closed on its line"),
    ('model,gap,"note\n"\nnets/net0.pt,0.1,a\nnets/net1.pt,0.2,x\n',
     "line 1: a quoted column name is not closed"),
])
def test_bad_manifests_end_in_one_line(saved, tmp_path, manifest, message):
    shutil.copytree(saved / "nets", tmp_path / "nets")
    shutil.copy(saved / "data.pt", tmp_path / "data.pt")
    (tmp_path / "bad.csv").write_text(manifest)
    code, _, stderr = _study(tmp_path, tmp_path / "out", manifest="bad.csv")
    assert code == 2, stderr
    assert stderr.startswith("quotientsharp study: error: ") and message in stderr
    assert stderr.count("\n") == 1


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_colour_is_refused(saved, tmp_path, value):
    # a point whose colour is not finite was drawn in no colour: left out of the plots while
    # their titles counted it
    rows = ["model,gap,learning_rate", "nets/net0.pt,0.1,0.01", f"nets/net1.pt,0.2,{value}",
            "nets/net2.pt,0.3,0.03"]
    (tmp_path / "colours.csv").write_text("\n".join(rows) + "\n")
    shutil.copytree(saved / "nets", tmp_path / "nets")
    shutil.copy(saved / "data.pt", tmp_path / "data.pt")
    code, _, stderr = _study(tmp_path, tmp_path / "out", "--color", "learning_rate",
                             manifest="colours.csv")
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert f"model 'nets/net1.pt' (line 3) has the non-finite value '{value}'" in stderr


def test_gap_from_with_every_gap_given_is_refused(saved, tmp_path):
    # every row gives its gap: --gap-from loss was accepted and changed nothing
    code, _, stderr = _study(saved, tmp_path / "out", "--gap-from", "loss")
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert ("error: --gap-from loss: every row of MANIFEST" in stderr
            and "gives its gap, so none is computed from train and test data" in stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["gap", "name"])
def test_colour_by_a_manifest_key_with_a_meaning_says_so(saved, tmp_path, key):
    # the manifest has a gap column, and the message said it had no such key
    code, _, stderr = _study(saved, tmp_path / "out", "--color", key)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert (f"--color {key}: '{key}' is a manifest key with a meaning" in stderr
            and "colours by one of the manifest's other keys, here ['learning_rate']" in stderr)


def test_bad_options_end_in_one_line(saved, tmp_path):
    for extra, message in ((["--confidence", "1.5"], "--confidence"),
                           (["--color", "nope"], "--color nope"),
                           (["--gap-from", "error", "--loss", "mse"], "--gap-from error")):
        code, _, stderr = _study(saved, tmp_path / "out", *extra)
        assert code == 2 and message in stderr and stderr.count("\n") == 1, stderr


def test_study_help_imports_no_torch():
    script = ("import contextlib, io, sys\nfrom quotientsharp.cli import main\n"
              "stream = io.StringIO()\nwith contextlib.redirect_stdout(stream):\n"
              "    try:\n        main(['study', '--help'])\n    except SystemExit:\n"
              "        pass\nprint('torch' in sys.modules)\nprint(stream.getvalue())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    imported, _, text = done.stdout.partition("\n")
    assert imported == "False"
    assert text.startswith("usage: quotientsharp study") and "``" not in text
    assert "--bootstrap" in text and "--resume" in text and "--rho R[,R...]" in text


# ---------------------------------------------------------------------------- labels (item 4)
def test_readable_labels_of_the_studies():
    from quotientsharp.reproduce.diagonal.measures import MEASURES
    from quotientsharp.reproduce.diagonal.report import measure_axis_label
    from quotientsharp.reproduce.families.measures import family_measures
    from quotientsharp.reproduce.families.report import spec_label
    from quotientsharp.workflows.labels import decades_note, measure_label, tau_title

    labels = {spec.name: measure_axis_label(spec, 0.1) for spec in MEASURES}
    assert labels["geodesic_mix_order2"] == "geodesic sharpness (mix metric, order 2, ρ = 0.1)"
    assert labels["geodesic_inv_exact"] == ("geodesic sharpness (inv metric, exact geodesic, "
                                            "ρ = 0.1)")
    assert labels["adaptive"] == "adaptive sharpness (ρ = 0.1)"
    family = {spec.key: spec_label(spec, greek=False)
              for spec in family_measures(0.1, 0.02, 0.1, 0.02)}
    assert family["geodesic_mix_o1"] == "geodesic sharpness (mix metric, order 1, rho = 0.02)"
    assert family["relative_flatness"] == "relative flatness"
    assert measure_label("worst_case", p="inf", rho=0.01) == ("worst-case sharpness (L∞ ball, "
                                                              "ρ = 0.01)")
    assert tau_title(-0.731, -0.735, paper=-0.86) == "Kendall τ-a -0.73, τ-b -0.73; paper τ -0.86"
    assert "(N = 5)" in tau_title(0.2, 0.2, interval=(-1.0, 1.0), count=5)
    assert decades_note([3.95e8, 2.27e20, 4.94e46]).startswith("values span 38 decades")
    assert decades_note([0.002, 0.005]) is None and decades_note([1.0, -1.0]) is None


def test_reproduce_console_states_the_sign_convention(monkeypatch, capsys):
    import quotientsharp.reproduce as experiments
    from quotientsharp.cli import reproduce

    class Study:
        GENERALISATION = "test loss"

        @staticmethod
        def run(args):
            print("the table")
            return 0

    monkeypatch.setattr(experiments, "load_study", lambda name: Study)
    assert reproduce.run(reproduce.argparse.Namespace(study="diagonal")) == 0
    out = capsys.readouterr().out
    assert out.startswith("the table")
    assert ("Positive tau: sharpness and test loss rank alike, sharper models generalise "
            "worse") in out
    assert "docs/results.md" in out


@pytest.mark.parametrize("fields, options", [
    ({"measures": "relative_flatness", "layer": "fc"}, "--measure relative_flatness --layer fc"),
    ({"measures": "worst_case", "rho": 0.1, "p": "inf", "seed": 3},
     "--measure worst_case --rho 0.1 --p inf --seed 3"),
    ({"measures": "average", "rho": 0.1}, "--measure average --rho 0.1"),
    # a user's symmetry changes every geodesic value: the command without it measured others
    ({"measures": "geodesic", "rho": 0.1, "symmetry": "my_symmetry:bind"},
     "--measure geodesic --rho 0.1 --metric inv --order 2 --symmetry my_symmetry:bind"),
    # every digit: %g's six gave 0.123457, another radius
    ({"measures": "geodesic", "rho": "0.1234567,1e-05", "eps": 1.2345678e-9},
     "--measure geodesic --rho 0.1234567,1e-05 --metric inv --order 2 --eps 1.2345678e-09"),
])
def test_the_report_names_the_options_that_differ_from_their_defaults(fields, options):
    # the defaults come from the settings themselves, for a grid without a radius too
    from quotientsharp.workflows.grid import build_grid
    from quotientsharp.workflows.options import StudyConfig
    from quotientsharp.workflows.report import command_line

    config = StudyConfig(data="d.pt", **fields)
    assert command_line("m.csv", config, build_grid(config)) == (
        f"quotientsharp study m.csv --data d.pt {options}")
