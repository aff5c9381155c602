"""What several test files share."""
import os
import sys
from pathlib import Path

import pytest

# The lectures' reusable pieces (notebooks/course/, helpers.site.saved) import as they do in a notebook,
# whose folder is on the path; the ranks a test starts inherit it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))


@pytest.fixture(scope="session")
def executed_dir(tmp_path_factory):
    """The lectures executed in this session: tests/test_notebooks.py writes each lecture's default
    run here, and tests/test_site.py renders the site from them instead of executing them again.
    EXECUTED_DIR names a folder that several pytest sessions share: `make test` runs the lectures
    that time nothing in its first phase, the others and the site in its second (the Makefile)."""
    shared = os.environ.get("EXECUTED_DIR")
    d = Path(shared) if shared else tmp_path_factory.getbasetemp() / "executed"
    d.mkdir(parents=True, exist_ok=True)
    return d
