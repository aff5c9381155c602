"""What several test files share."""
import pytest


@pytest.fixture(scope="session")
def executed_dir(tmp_path_factory):
    """The lectures executed in this session: tests/test_notebooks.py writes each lecture's default
    run here, and tests/test_site.py renders the site from them instead of executing them again."""
    d = tmp_path_factory.getbasetemp() / "executed"
    d.mkdir(exist_ok=True)
    return d
