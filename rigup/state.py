"""Reading a host's state once per run: pyinfra 3 caches no fact."""

from pyinfra import host
from pyinfra.api.state import StateStage

_read: dict[tuple, object] = {}


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
