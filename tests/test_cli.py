"""The ``quotientsharp`` console script as a whole: every command's help imports no torch and
shows no reStructuredText markup.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_help_imports_no_torch_and_shows_no_rst():
    script = textwrap.dedent("""
        import contextlib, io, json, sys
        from quotientsharp.cli import main
        texts = {}
        for argv in ([], ["verify"], ["symmetries"], ["measure"], ["reproduce"]):
            stream = io.StringIO()
            with contextlib.redirect_stdout(stream):
                try:
                    main([*argv, "--help"])
                except SystemExit:
                    pass
            texts[" ".join(argv)] = stream.getvalue()
        print(json.dumps({"torch": "torch" in sys.modules, "texts": texts}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    report = json.loads(done.stdout)
    assert report["torch"] is False
    for command, text in report["texts"].items():
        assert text.startswith("usage: quotientsharp"), command
        assert "``" not in text and ":func:" not in text and ":data:" not in text, command
    reproduce = report["texts"]["reproduce"]
    for internal in ("add_arguments", "STUDIES", "module path", "run(args)"):
        assert internal not in reproduce
    for study in ("diagonal", "vit", "bert", "minilm", "vit-finetune", "lora", "invariance"):
        assert study in reproduce


def test_version_names_the_installed_release_without_importing_torch():
    script = ("import contextlib, io, json, sys\n"
              "from quotientsharp.cli import main\n"
              "stream = io.StringIO()\n"
              "with contextlib.redirect_stdout(stream):\n"
              "    try:\n"
              "        main(['--version'])\n"
              "    except SystemExit as exit:\n"
              "        code = exit.code\n"
              "print(json.dumps([stream.getvalue(), code, 'torch' in sys.modules]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    tomllib = __import__("tomllib")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert json.loads(done.stdout) == [f"quotientsharp {version}\n", 0, False]


def test_argument_errors_are_one_line_of_every_command(capsys):
    import pytest

    from quotientsharp.cli import main

    for arguments, prog, needle in (
            (["measure", "m.pt", "d.pt", "--chains", "2.5"], "quotientsharp measure",
             "argument --chains: invalid int value: '2.5'"),
            (["measure", "m.pt", "d.pt", "--n-iter", "abc"], "quotientsharp measure",
             "argument --n-iter"),
            (["measure", "m.pt", "d.pt", "--dtype", "float16"], "quotientsharp measure",
             "argument --dtype: invalid choice: 'float16'"),
            (["measure", "m.pt"], "quotientsharp measure", "required: data"),
            (["verify", "--seeds", "abc"], "quotientsharp verify", "argument --seeds"),
            (["symmetries"], "quotientsharp symmetries", "required: model"),
            (["study", "models.csv"], "quotientsharp study", "required: --data"),
            (["reproduce", "diagonal", "--nets", "x"], "quotientsharp reproduce diagonal",
             "argument --nets"),
            (["sharpen"], "quotientsharp", "argument command: invalid choice")):
        with pytest.raises(SystemExit) as info:
            main(arguments)
        error = capsys.readouterr().err
        assert info.value.code == 2, arguments
        # one line, no usage block; where to look for the usage is said on it
        assert error.count("\n") == 1 and "usage:" not in error, error
        assert error.startswith(f"{prog}: error: ") and needle in error, error
        assert error.endswith(f"(see {prog} --help)\n"), error


def test_help_still_shows_the_usage_and_every_option(capsys):
    import pytest

    from quotientsharp.cli import main

    with pytest.raises(SystemExit) as info:
        main(["measure", "--help"])
    text = capsys.readouterr().out
    assert info.value.code == 0 and text.startswith("usage: quotientsharp measure")
    for option in ("--nonfinite {raise,skip}", "--json OUT", "--p P", "--samples SAMPLES"):
        assert option in text, option


def test_bad_values_the_parser_lets_through_are_one_line_too(capsys):
    from quotientsharp.cli import main

    # refused by the command (symmetries) or by the study's configuration (reproduce)
    for arguments, prog, message in (
            (["symmetries", "config.json", "--diagonal", "u,v,w"], "quotientsharp symmetries",
             "--diagonal expects U,V, got 'u,v,w'"),
            (["reproduce", "diagonal", "--nets", "0", "--no-plots"],
             "quotientsharp reproduce diagonal", "nets must be an integer >= 2, got 0")):
        assert main(arguments) == 2, arguments
        assert capsys.readouterr().err == f"{prog}: error: {message}\n"


def test_an_option_of_one_value_given_twice_is_refused(capsys):
    # argparse keeps the last: --rho 0.1 --rho 0.2 measured 0.2 alone, and --json a --json b
    # wrote b alone, each with exit status 0
    import pytest

    from quotientsharp.cli import build_parser, main

    for arguments, prog, given in (
            (["measure", "m.pt", "d.pt", "--rho", "0.1", "--rho", "0.2"],
             "quotientsharp measure", "argument --rho: given twice (--rho 0.1, then --rho 0.2)"),
            (["measure", "m.pt", "d.pt", "--json", "a.json", "--json=b.json"],
             "quotientsharp measure",
             "argument --json: given twice (--json a.json, then --json b.json)"),
            (["study", "m.csv", "--data", "d.pt", "--progress", "--no-progress"],
             "quotientsharp study",
             "argument --progress/--no-progress: given twice (--progress, then --no-progress)"),
            (["verify", "--seeds", "1", "--seeds", "1"], "quotientsharp verify",
             "argument --seeds: given twice (--seeds 1, then --seeds 1)"),
            (["reproduce", "diagonal", "--out", "a", "--out", "b"],
             "quotientsharp reproduce diagonal", "argument --out: given twice")):
        with pytest.raises(SystemExit) as info:
            main(arguments)
        error = capsys.readouterr().err
        assert info.value.code == 2, arguments
        assert error.startswith(f"{prog}: error: {given}") and error.count("\n") == 1, error
    # options that collect still repeat, and a parser parses anew each time
    parser = build_parser()
    for _ in range(2):
        args = parser.parse_args(["measure", "m.pt", "d.pt", "--rho", "0.1", "--measure",
                                  "adaptive", "--measure", "geodesic", "--no-progress"])
        assert args.measure == ["adaptive", "geodesic"] and args.rho == 0.1
        assert args.progress is False
