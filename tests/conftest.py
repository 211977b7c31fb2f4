import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
SHARED = HERE.parent.parent / "shared"


@pytest.fixture(scope="session")
def shared() -> Path:
    """The read-only data folder laid out beside the checkout (as in CI)."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not beside the checkout")
    return SHARED
