#!/usr/bin/env bash
# Mutation testing (mutmut 3) of the GL metrics' closed forms, the exact trust-region solver
# and the engine's measures, restricted so that it finishes on a 2-core machine in well under an
# hour. Run from anywhere:  bash benchmarks/mutation.sh [mutant-glob ...]
#
# The run happens in a scratch copy of the working tree (MUTATION_DIR, default a fresh temporary
# folder) whose pyproject.toml gets a [tool.mutmut] table, so the project's own configuration
# and tree stay untouched. mutmut maps every test to the functions it runs and runs, per
# mutant, only the tests that reach the mutated function, one process at a time (-n 0: a
# mutant's tests stay in one process; nice: the machine is shared).
#
# What is mutated (MUTATED below), one group each, with the tests that pin it (TESTED):
# - gl, diagonal, adaptive: the core geometry (quotientsharp/core/gl/*, core/diagonal/*,
#   core/adaptive.py and core/product.py): metrics, moments, projections, raised gradients,
#   Christoffel contractions, isotropic draws, frozen points;
# - solver: engine/solver.py (Auto-PGD) and engine/ball.py (the trust regions), pinned by an
#   independent Auto-PGD written from its definition and the trust-region contracts
#   (tests/test_sharpness_solver.py, tests/test_ball.py), and the fast paths (in-place, fused) against the plain
#   formulas. Not tests/test_compiled_steps.py: mutmut's trampolines read a ContextVar, which
#   dynamo cannot trace, so the compiled tests' "no graph break" assertion fails on every run;
# - exact: engine/exact.py, the exact trust-region maximum (the solver's reference);
# - measures: engine/measures.py (average, ascent, relative flatness and their errors).
# mutmut does not mutate decorated functions (cached_property), so those are reached only
# through their callers. benchmarks/mutation_survivors.md gives the last run's scores and
# explains every survivor.
#
# On a shared 2-core machine a whole run takes hours: narrow it and run it in chunks (results
# are kept per mutant in MUTATION_DIR, so a second run with the same MUTATION_DIR goes on where
# the first stopped; naming mutants reruns them). mutmut maps tests to functions once and then
# only adds new tests: after the code or the tests changed, delete MUTATION_DIR/<group>/mutants/
# mutmut-stats.json for a fresh map (verdicts are kept). Changing a group's test files makes
# mutmut forget every verdict of that group.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${MUTATION_DIR:-$(mktemp -d -t quotientsharp-mutation.XXXXXX)}
command -v mutmut >/dev/null || { echo "mutmut is not installed: pip install 'mutmut>=3.3'" >&2; exit 2; }

# MUTATION_GROUPS, MUTATION_PATTERNS (mutant name globs) and MUTATION_TESTS (test files) narrow a
# run, e.g. MUTATION_GROUPS=measures MUTATION_PATTERNS='quotientsharp.engine.measures.x__check_ascents*'
# Each group has the tests that pin it (mutmut runs, per mutant, those among them that reach
# the mutated function); MUTATION_GROUPS picks some ("solver measures")
declare -A MUTATED=(
    [gl]='"quotientsharp/core/gl/*.py"'
    [diagonal]='"quotientsharp/core/diagonal/*.py"'
    [adaptive]='"quotientsharp/core/adaptive.py", "quotientsharp/core/product.py"'
    [solver]='"quotientsharp/engine/solver.py", "quotientsharp/engine/ball.py"'
    [exact]='"quotientsharp/engine/exact.py"'
    [measures]='"quotientsharp/engine/measures.py"'
)
# which of a group's mutants run (mutmut's name globs; empty: all of them)
declare -A PATTERNS=(
    [gl]=""
    [diagonal]=""
    [adaptive]=""
    [solver]=""
    [exact]=""
    [measures]=""
)
declare -A TESTED=(
    [gl]="tests/test_gl.py tests/test_rotary.py tests/test_quotient_properties.py tests/test_quotient_contract.py tests/test_ball.py tests/test_group_elements.py tests/test_invariance_conditioning.py"
    [diagonal]="tests/test_diagonal.py tests/test_quotient_contract.py tests/test_ball.py"
    [adaptive]="tests/test_quotient_contract.py tests/test_quotient_abstract.py tests/test_fused_steps.py tests/test_inplace_steps.py tests/test_touched_rows.py tests/test_adaptive.py tests/test_ball.py tests/test_sharpness_geometry.py tests/test_product_quotient.py"
    [solver]="tests/test_sharpness_solver.py tests/test_solver_quality.py tests/test_sharpness_geometry.py tests/test_ball.py tests/test_measures.py tests/test_fused_steps.py tests/test_inplace_steps.py"
    [exact]="tests/test_solver_quality.py tests/test_functional.py tests/test_batches.py tests/test_measures.py"
    [measures]="tests/test_sharpness.py tests/test_measures.py tests/test_functional.py tests/test_batches.py tests/test_options.py tests/test_blockwise.py tests/test_touched_rows.py"
)

run_group() {
    local group=$1 dir="$work/$1" tests=""
    mkdir -p "$dir"
    for t in ${MUTATION_TESTS:-${TESTED[$group]}}; do
        [ -e "$root/$t" ] && tests="$tests${tests:+, }\"$t\""
    done
    # the working tree as it is (tracked and untracked, not ignored), without git's history
    (cd "$root" && git ls-files -z --cached --others --exclude-standard \
        | xargs -0 cp --parents -t "$dir" 2>/dev/null || true)
    # the tests must import the mutated copy: an editable install of the project elsewhere
    # (a meta-path finder) would otherwise answer "import quotientsharp" in mutmut's workers
    cat >> "$dir/tests/conftest.py" <<'PY'


# added by benchmarks/mutation.sh (the scratch copy only): the package under mutants/, never an
# editable install elsewhere
import sys as _sys  # noqa: E402
from pathlib import Path as _Path  # noqa: E402

import importlib as _importlib  # noqa: E402

_HERE = str(_Path(__file__).resolve().parents[1])
# a path finder cached for mutants/ before mutmut filled it would find nothing there
_importlib.invalidate_caches()
_sys.meta_path[:] = [f for f in _sys.meta_path if "editable" not in repr(f).lower()]
if _HERE not in _sys.path:
    _sys.path.insert(0, _HERE)
for _name in [n for n in _sys.modules if n.split(".")[0] == "quotientsharp"]:
    if not str(getattr(_sys.modules[_name], "__file__", "") or "").startswith(_HERE):
        del _sys.modules[_name]
PY
    cat >> "$dir/pyproject.toml" <<TOML

[tool.mutmut]
source_paths = ["quotientsharp"]
also_copy = ["benchmarks", "derivations", "docs", "examples", "mkdocs.yml", "README.md", "CHANGELOG.md"]
only_mutate = [${MUTATED[$group]}]
pytest_add_cli_args = ["-n", "0", "-p", "no:cacheprovider", "-q", "-x"]
pytest_add_cli_args_test_selection = [$tests]
TOML
    echo "== $group: mutation run in $dir" >&2
    local start
    start=$(date +%s)
    # mutmut puts mutants/ first on sys.path; PYTHONPATH keeps an editable install elsewhere out
    (cd "$dir" && PYTHONPATH="$dir/mutants" nice -n "${MUTATION_NICE:-15}" \
        mutmut run --max-children "${MUTATION_CHILDREN:-1}" ${MUTATION_PATTERNS:-${PATTERNS[$group]}} \
        > "$dir/run.log" 2>&1) || true
    echo "== $group: $(( $(date +%s) - start )) s" >&2
    (cd "$dir" && PYTHONPATH="$dir/mutants" mutmut results --all true > "$dir/results.txt" 2>&1) || true
    echo "== $group: $(grep -c ': killed' "$dir/results.txt") killed; not killed:" >&2
    grep -v ': killed' "$dir/results.txt" >&2 || true
}

for group in ${MUTATION_GROUPS:-exact measures solver gl diagonal adaptive}; do
    run_group "$group"
done
