"""The examples that docstrings show (``>>>``) give what they show."""

from pathlib import Path

import pytest


def _modules_with_examples() -> list[str]:
    import nestplan

    root = Path(nestplan.__file__).parent
    return sorted(".".join(("nestplan", *p.relative_to(root).with_suffix("").parts))
                  .removesuffix(".__init__")
                  for p in root.rglob("*.py") if ">>>" in p.read_text())


@pytest.mark.parametrize("module", _modules_with_examples())
def test_the_examples_in_docstrings_run(module):
    """Every module whose docstrings show examples (``>>>``) gives what they show."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
