"""An inventory file read as pyinfra documents them, for the controller scripts that must know the
fleet before they drive pyinfra's CLI (roll.py, shards.py): the hosts, their groups and their data.

pyinfra's documented format (docs.pyinfra.com, "Inventory & Data"): an inventory file's
module-level lists of hosts (or ``(hosts, data)`` tuples) whose names do not start with ``_``
are its groups; ``all`` holds every host (with its own data when it is a tuple: rigup's files end
in ``all = all_group(globals())``, rigup.config); every host is also in the group named after the
file. The result is pyinfra's public ``pyinfra.api.Inventory``, built as the CLI builds it (the
groups in the file's order, ``all`` and the file's own group last), with the ``--data`` given.

Written here, not imported from pyinfra_cli (its inventory module is the CLI's own code, with no
promise to callers, and importing pyinfra_cli patches the standard library with gevent).
tests/unit/test_inventory.py checks that both read every inventory of the checkout alike. Not
read: pyinfra's ``group_data/*.py`` directories (rigup's group data is group_vars/*.yml, which
``all_group`` layers in); one next to the inventory or in the checkout is refused, naming it,
since pyinfra would read it and the two would see different data.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pyinfra.api import Inventory

from rigup.boundary import Unreadable, fields
from rigup.config import ConfigError, cli_value, data_texts

ROOT = Path(__file__).resolve().parents[1]


def overrides(args: list[str]) -> dict[str, Any]:
    """The ``--data key=value`` pairs among pyinfra's arguments (``--data k=v`` or ``--data=k=v``),
    each value as pyinfra's CLI reads it (rigup.config.data_number_problems: the numbers it refuses)."""
    return {k: cli_value(v) for k, v in data_texts(args).items()}


def _group(key: str, value: Any) -> bool:
    """Whether a module-level name of the file is a group, as pyinfra's documentation defines one."""
    if key.startswith("_") or not isinstance(value, (list, tuple)):
        return False
    hosts = value[0] if isinstance(value, tuple) else value
    return isinstance(hosts, list) and all(isinstance(h, (str, tuple)) for h in hosts)


def read(path: str | Path, override_data: dict[str, Any] | None = None) -> Inventory:
    """The inventory file ``path`` as a pyinfra Inventory (see the module docstring); a missing
    file, one that is not an inventory file, a pyinfra group_data/ directory beside it, or a host whose
    name is neither a name, an address nor a connector's (rigup.boundary.fields.host_name: pyinfra prints
    it before each of its lines) is refused with ConfigError, naming it."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".py":
        raise ConfigError(f"{path}: not an inventory file (a .py file of host groups); roll.py and shards.py "
                          "read the fleet from one")
    for folder in {ROOT / "group_data", path.resolve().parent / "group_data"}:
        if folder.is_dir():
            raise ConfigError(f"{folder}: a pyinfra group_data directory; rigup's group data is group_vars/*.yml "
                              "(move its values there)")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))   # as pyinfra's CLI, run from the checkout: inventories import from it
    module: dict[str, Any] = {"__file__": str(path)}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module)   # noqa: S102 - the user's own file
    groups = {k: (v if isinstance(v, tuple) else (v, {})) for k, v in module.items() if _group(k, v)}
    every = groups.pop("all", None)
    if every is None:
        names = list(dict.fromkeys(h[0] if isinstance(h, tuple) else h for hosts, _ in groups.values() for h in hosts))
        every = (names, {})
    groups["all"] = every
    for hosts, _ in groups.values():
        for h in hosts:
            name = h[0] if isinstance(h, tuple) else h
            try:
                fields.host_name(name, f"{path}: the host {str(name)[:60]!r}")
            except Unreadable as e:
                raise ConfigError(f"{e.where}: {e.why}") from None
    groups.setdefault(path.name.rsplit(".", 1)[0], (every[0], {}))
    return Inventory(groups.pop("all"), override_data=dict(override_data or {}), **groups)
