"""The adapters name the extra to install when their framework is missing."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "framework", "hint"),
    [
        ("llm.adapters.trl", "trl", "clip-sandbox[trl]"),
        ("llm.adapters.verl", "verl", "clip-sandbox[verl]"),
    ],
)
def test_missing_framework_gives_the_install_hint(monkeypatch, module, framework, hint):
    monkeypatch.setitem(sys.modules, framework, None)  # `import trl` now raises ImportError
    monkeypatch.delitem(sys.modules, module, raising=False)  # import the adapter afresh
    with pytest.raises(
        ImportError, match=r"pip install '" + hint.replace("[", r"\[").replace("]", r"\]")
    ):
        importlib.import_module(module)
