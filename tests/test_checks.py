"""``quotientsharp.core.checks.check_all`` refuses what is not a quotient."""

from __future__ import annotations

import pytest

import quotientsharp as qs


def test_check_all_rejects_a_name():
    with pytest.raises(TypeError, match="SymmetryQuotient instance"):
        qs.checks.check_all("gl")
