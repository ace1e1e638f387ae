"""The project's Jinja2 templates (``templates/<role>-*.j2``), rendered strictly. No pyinfra here:
pure modules (command lines, unit texts) render with it on machines without pyinfra."""

import re
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


# systemd units, drop-ins and other line-based config files: one value never makes a second line
_LINE_BASED = (".service.j2", ".conf.j2", ".timer.j2", ".rules.j2", "-unit.service.j2")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(value, where: str) -> None:
    """ValueError when a string anywhere in ``value`` holds a newline or another control character."""
    if isinstance(value, str):
        if _CONTROL.search(value):
            raise ValueError(f"{where}: {value[:80]!r} holds a newline or a control character; refused")
    elif isinstance(value, dict):
        for k, v in value.items():
            _one_line(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for v in value:
            _one_line(v, where)


def render(template_name: str, /, **values) -> str:
    """``templates/<template_name>`` rendered (strict: an undefined value is an error; filters
    ``quote`` and ``q`` shell-quote). A line-based file (a unit, a drop-in) refuses any value with a
    newline or a control character (a revision read back from a marker the rigup user can write,
    a hub's file name): it would add a line, such as ``ExecStartPre=+...`` run as root."""
    if template_name.endswith(_LINE_BASED):
        for key, value in values.items():
            _one_line(value, f"{template_name}: {key}")
    return _ENV.get_template(template_name).render(**values)
