"""SystemExit and KeyboardInterrupt from a user's code end a command with one line naming the
module and a non-zero status (issue 40, item 5).

Before, ``sys.exit(0)`` in a pickled model's ``forward`` ended ``measure`` with status 0 and no
output, and ``sys.exit(3)`` in a ``--symmetry`` function exited 3 with no message.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from tests.test_cli_symmetry import _call  # (code, stdout, stderr) of the CLI

NET = '''
import sys
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x):
        {body}
        return self.layer(x)


def bind(model):
    {body}
    return []
'''


def _folder(tmp_path: Path, monkeypatch, name: str, forward: str, symmetry: str) -> Path:
    """A model module ``name`` (its forward runs ``forward``), ``name``_sym (its ``bind``
    runs ``symmetry``), a pickled model and data, in the working directory."""
    (tmp_path / f"{name}.py").write_text(NET.format(body=forward))
    (tmp_path / f"{name}_sym.py").write_text(NET.format(body=symmetry))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    torch.manual_seed(0)
    torch.save(module.Net(), tmp_path / "net.pt")
    torch.save((torch.randn(16, 4), torch.randint(0, 3, (16,))), tmp_path / "data.pt")
    return tmp_path


MEASURE = ["--measure", "adaptive", "--rho", "0.1", "--n-iter", "1", "--no-progress"]


@pytest.mark.parametrize("body, status, what", [
    ("sys.exit(0)", 1, "SystemExit(0)"),
    ("sys.exit('bye')", 1, "SystemExit('bye')"),
    ("raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
])
def test_the_model_forward_exiting_is_reported_naming_its_module(tmp_path, monkeypatch, body,
                                                                  status, what):
    name = f"exiting_net_{status}_{abs(hash(body)) % 1000}"
    path = _folder(tmp_path, monkeypatch, name, body, "pass")
    code, stdout, stderr = _call("measure", path / "net.pt", path / "data.pt", *MEASURE,
                                 "--json", path / "out.json")
    assert code == status
    assert f"user code raised {what}" in stderr and f"module {name!r}" in stderr
    assert "in forward" in stderr and stderr.count("\n") == 1


def test_a_symmetry_function_exiting_is_reported_naming_its_module(tmp_path, monkeypatch):
    path = _folder(tmp_path, monkeypatch, "calm_net_a", "pass", "sys.exit(3)")
    code, _, stderr = _call("measure", path / "net.pt", path / "data.pt", *MEASURE,
                            "--measure", "geodesic", "--symmetry", "calm_net_a_sym:bind")
    assert code == 1
    assert "SystemExit(3)" in stderr and "module 'calm_net_a_sym'" in stderr
    assert "in bind" in stderr


def test_a_quotient_module_interrupting_at_import_is_reported(tmp_path, monkeypatch):
    (tmp_path / "interrupting_quotient.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.chdir(tmp_path)
    code, _, stderr = _call("verify", "--quotient", "interrupting_quotient:Q")
    assert code == 130
    assert "KeyboardInterrupt" in stderr and "module 'interrupting_quotient'" in stderr


def test_an_exit_of_the_package_itself_is_not_attributed_to_user_code():
    with pytest.raises(SystemExit) as info:
        _call("verify", "--seeds", "not-a-number")
    assert info.value.code == 2
