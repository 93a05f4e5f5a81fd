"""sandbox.experiments.pool: a failing run stops new ones, in both of imap_unordered's modes."""

from __future__ import annotations

import operator

import pytest

from sandbox.experiments.pool import imap_unordered

JOBS = [("a", (6, 2)), ("b", (1, 0)), ("c", (8, 2))]  # b divides by zero


def test_all_at_once_a_failing_run_is_raised_naming_it_and_the_others_are_right():
    seen = []
    with pytest.raises(RuntimeError, match=r"run b failed: ZeroDivisionError") as info:
        for key, result in imap_unordered(operator.truediv, JOBS, 2):
            seen.append((key, result))
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert set(seen) <= {("a", 3.0), ("c", 4.0)}  # c ran only if it had started before b failed


def test_one_at_a_time_nothing_starts_after_a_failure_or_after_admit_says_no():
    seen = []
    with pytest.raises(RuntimeError, match=r"run b failed"):
        for key, result in imap_unordered(operator.truediv, JOBS, 1, admit=lambda key: True):
            seen.append((key, result))
    assert seen == [("a", 3.0)]  # c was never submitted
    ok = [("a", (6, 2)), ("c", (8, 2)), ("b", (1, 0))]
    admitted = list(imap_unordered(operator.truediv, ok, 1, admit=lambda key: key != "b"))
    assert admitted == [("a", 3.0), ("c", 4.0)]  # b, refused, never ran
