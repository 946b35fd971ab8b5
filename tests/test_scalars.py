"""The torch-free scalar helpers of ``quotientsharp.core.scalars`` that messages share."""

from __future__ import annotations

import pytest

from quotientsharp.core.scalars import shortened


@pytest.mark.parametrize(("names", "limit", "expected"), [
    (["a", "b", "c"], 2, "a, b, ..."),
    (["a", "b", "c"], 3, "a, b, c"),
    (["a"], 4, "a"),
    ([], 3, ""),
])
def test_shortened_names_the_first_names_and_marks_the_rest(names, limit, expected):
    assert shortened(names, limit) == expected
