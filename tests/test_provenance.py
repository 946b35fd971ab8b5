"""Every results section names the command, the package version and the commit that made it."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest
from results_pages.sections import HAND_WRITTEN_MARKER, provenance_line, write_section

import quotientsharp
from quotientsharp.reproduce.provenance import (
    Provenance,
    current_provenance,
    default_command,
    git_state,
)
from tests.pages.docs_folder import docs_with_renderer

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c",
                           "user.email=t@example.org", *args], capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


@needs_git
def test_git_state_names_the_commit_and_whether_tracked_files_changed(tmp_path) -> None:
    package = tmp_path / "checkout" / "quotientsharp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    _git(tmp_path / "checkout", "init", "-q")
    _git(tmp_path / "checkout", "add", ".")
    _git(tmp_path / "checkout", "commit", "-q", "-m", "first")
    head = _git(tmp_path / "checkout", "rev-parse", "HEAD")
    assert git_state(package) == (head, False)
    # an untracked file is not a change to what made the page
    (package / "notes.txt").write_text("scratch\n")
    assert git_state(package) == (head, False)
    (package / "__init__.py").write_text("x = 2\n")
    assert git_state(package) == (head, True)


@needs_git
def test_git_state_degrades_outside_the_packages_own_checkout(tmp_path) -> None:
    assert git_state(tmp_path) == (None, None)
    # a package folder nested deeper in some other repository is not that repository's code
    nested = tmp_path / "other" / "site-packages" / "quotientsharp"
    nested.mkdir(parents=True)
    _git(tmp_path / "other", "init", "-q")
    assert git_state(nested) == (None, None)


def test_git_state_without_git_on_the_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert git_state(Path(quotientsharp.__file__).parent) == (None, None)


def test_default_command_is_the_one_a_user_types() -> None:
    main = str(Path("somewhere") / "quotientsharp" / "__main__.py")
    assert default_command([main, "reproduce", "diagonal", "--docs", "docs"]) == (
        "quotientsharp reproduce diagonal --docs docs")
    assert default_command(["/usr/bin/quotientsharp", "reproduce", "a b"]) == (
        "quotientsharp reproduce 'a b'")
    assert default_command(["examples/x.py", "--n", "3"]) == "python examples/x.py --n 3"
    assert default_command([]) == "python"


def test_current_provenance_reports_the_imported_package() -> None:
    stamp = current_provenance("quotientsharp reproduce diagonal")
    assert stamp.version == quotientsharp.__version__
    assert stamp.command == "quotientsharp reproduce diagonal"
    assert (stamp.commit is None) == (stamp.dirty is None)
    if stamp.commit is not None:
        assert len(stamp.commit) == 40 and int(stamp.commit, 16) >= 0
    with pytest.raises(ValueError, match="command"):
        current_provenance("  ")


@pytest.mark.parametrize(("commit", "dirty", "expected"), [
    ("0123456789abcdef" * 2 + "01234567", True, "at commit `0123456789ab`, with uncommitted"),
    ("fedcba9876543210" * 2 + "76543210", False, "at commit `fedcba987654`, clean"),
    (None, None, "outside a git checkout (commit unknown)"),
])
def test_provenance_line_states_each_field(commit, dirty, expected) -> None:
    line = provenance_line(dataclasses.asdict(Provenance(
        "9.9.9", commit, dirty, "quotientsharp reproduce x", "2030-01-02")))
    assert line.startswith("*Made by `quotientsharp reproduce x` with quotientsharp 9.9.9 ")
    assert expected in line and "2030-01-02" in line and line.endswith("*")


def test_write_section_stamps_below_the_heading_and_keeps_the_hand_written_tail(
        tmp_path) -> None:
    stamp = Provenance("1.2.3", None, None, "quotientsharp reproduce bert --docs docs",
                       "2030-01-02")
    docs_with_renderer(tmp_path)
    path = write_section(tmp_path, "bert", "## BERT\n\nrun 1", dataclasses.asdict(stamp))
    lines = path.read_text().splitlines()
    assert lines[0] == "## BERT" and lines[2] == provenance_line(dataclasses.asdict(stamp))
    assert lines[4] == "run 1"
    path.write_text(path.read_text() + f"\n{HAND_WRITTEN_MARKER}\n\nnotes\n")
    later = Provenance("1.2.4", "ab" * 20, False, "quotientsharp reproduce bert", "2030-02-03")
    text = write_section(tmp_path, "bert", "## BERT\n\nrun 2",
                         dataclasses.asdict(later)).read_text()
    # one stamp, the new one, above the kept tail
    assert text.count("*Made by") == 1 and "1.2.4" in text and "1.2.3" not in text
    assert text.index("*Made by") < text.index("run 2") < text.index(HAND_WRITTEN_MARKER)
    # the stamp of this process, under the command it is given
    default = write_section(tmp_path, "vit", "## ViT\n\nx",
                            dataclasses.asdict(current_provenance("my command"))).read_text()
    assert f"`my command` with quotientsharp {quotientsharp.__version__}" in default
