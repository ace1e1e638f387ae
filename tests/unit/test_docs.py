"""The generated parts of the documentation are current (regenerate: python -m tests.docs)."""

from tests import docs


def test_readme_refusal_table_is_current():
    assert docs.BEGIN in docs.README.read_text(), "README lacks the generated refusal table"
    assert docs.readme() == docs.README.read_text(), "README is stale: run .venv/bin/python -m tests.docs"
