"""Pieces shared by every role: templates, and reading a host's state once per run."""

import shlex
from pathlib import Path

import jinja2
from pyinfra import host
from pyinfra.api.state import StateStage

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates"
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True)
_ENV.filters["quote"] = _ENV.filters["q"] = lambda v: shlex.quote(str(v))
_read: dict[tuple, object] = {}


def template(name: str) -> str:
    """Absolute path of ``templates/<name>``: pyinfra resolves relative paths against the CWD."""
    return str(TEMPLATES / name)


def render(template_name: str, /, **values) -> str:
    """``templates/<template_name>`` rendered (strict: an undefined value is an error; filters
    ``quote`` and ``q`` shell-quote)."""
    return _ENV.get_template(template_name).render(**values)


def read_once(fact, **kwargs):
    """``host.get_fact(fact, **kwargs)``, read again only once an operation has run commands on
    the host. pyinfra 3 caches no fact and runs every operation's body twice (to detect changes,
    then to execute), so a role's state fact would be read once per operation and again at
    execution; a converge with nothing to do reads it once."""
    if host.state.current_stage not in (StateStage.Prepare, StateStage.Execute):
        return host.get_fact(fact, **kwargs)
    ran = sum(1 for op in host.state.ops[host].values() if op.operation_meta.executed)
    key = (id(host.state), host.name, ran, fact.__module__, fact.__name__, repr(sorted(kwargs.items())))
    if key not in _read:
        _read[key] = host.get_fact(fact, **kwargs)
    return _read[key]
