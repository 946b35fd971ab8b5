"""``quotientsharp reproduce``: each study's help imports no torch, and a distributed timeout
ends in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("study", ["diagonal", "vit", "bert", "invariance"])
def test_study_help_imports_no_torch(study):
    """``reproduce STUDY --help`` declares the study's options from a torch-free module."""
    script = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from quotientsharp.cli import main
        stream = io.StringIO()
        with contextlib.redirect_stdout(stream):
            try:
                main(["reproduce", "{study}", "--help"])
            except SystemExit:
                pass
        print(json.dumps({{"torch": "torch" in sys.modules, "text": stream.getvalue()}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    report = json.loads(done.stdout)
    assert report["torch"] is False
    text = report["text"]
    assert text.startswith(f"usage: quotientsharp reproduce {study}")
    for option in ("--out", "--resume", "--quick", "--seed", "--docs", "--threads",
                   "--dist-timeout"):
        assert option in text, option


GLOO_TIMEOUT = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                "waiting 1800000ms for recv operation to complete")


def test_reproduce_reports_a_distributed_timeout_in_one_line(monkeypatch, capsys):
    import torch.distributed as dist

    import quotientsharp.reproduce as experiments
    import quotientsharp.workflows.process_group as qd
    from quotientsharp.cli import reproduce

    class Study:
        @staticmethod
        def run(args):
            raise RuntimeError(GLOO_TIMEOUT)

    destroyed = []
    monkeypatch.setattr(experiments, "load_study", lambda name: Study)
    monkeypatch.setattr(qd, "torchrun_world_size", lambda: 2)
    monkeypatch.setattr(qd, "init_distributed", lambda timeout: (0, 2))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: destroyed.append(True))
    args = reproduce.argparse.Namespace(study="vit", dist_timeout=5.0)
    assert reproduce.run(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("quotientsharp reproduce vit: error: rank 0 of 1 timed out")
    assert "--dist-timeout 5 s" in err and "--resume" in err and err.count("\n") == 1
    assert destroyed == [True]


def test_summary_names_the_missing_renderer_before_the_missing_data(tmp_path, capsys) -> None:
    from quotientsharp.cli import main

    # a folder that is not a checkout's docs: the renderer is what it lacks first
    assert main(["reproduce", "summary", "--docs", str(tmp_path / "docs")]) == 2
    err = capsys.readouterr().err
    assert "--docs" in err and "no results-page renderer" in err
    assert "no headline file" not in err
