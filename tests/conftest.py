import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
SHARED_CASES = Path(__file__).resolve().parents[2] / "shared" / "cases" / "estimators.json"


def load_cases() -> list[dict]:
    """The worked cases of ../shared/cases (a vendored copy when the checkout has no shared/)."""
    path = SHARED_CASES if SHARED_CASES.exists() else DATA / "estimators.json"
    return json.loads(path.read_text())["cases"]


@pytest.fixture(scope="session")
def cases() -> list[dict]:
    return load_cases()
