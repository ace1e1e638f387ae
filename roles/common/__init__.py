"""Pieces shared by every role: where templates live, and operations several roles use."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates"


def template(name: str) -> str:
    """Absolute path of ``templates/<name>``: pyinfra resolves relative paths against the CWD."""
    return str(TEMPLATES / name)
