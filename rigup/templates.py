"""The project's Jinja2 templates (``templates/<role>-*.j2``), rendered strictly. No pyinfra here:
pure modules (command lines, unit texts) render with it on machines without pyinfra."""

import shlex
from pathlib import Path

import jinja2

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "templates"
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True)
_ENV.filters["quote"] = _ENV.filters["q"] = lambda v: shlex.quote(str(v))


def template(name: str) -> str:
    """Absolute path of ``templates/<name>``: pyinfra resolves relative paths against the CWD."""
    return str(TEMPLATES / name)


def render(template_name: str, /, **values) -> str:
    """``templates/<template_name>`` rendered (strict: an undefined value is an error; filters
    ``quote`` and ``q`` shell-quote)."""
    return _ENV.get_template(template_name).render(**values)
