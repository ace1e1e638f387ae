"""Reading a host's state once per run, in as few round trips as the play allows.

pyinfra 3 caches no fact, and runs an operation's body when the operation executes: a fact read
there is a round trip in the middle of the run, and every host of the fleet waits for the slowest
one before the next operation starts. So a role names, while its ``apply`` runs (before any
operation executes), the facts its operations will read (:func:`will_read`, or the
:func:`reading` decorator on an operation); the first of those reads then reads every named fact
of the host not read yet in one command (:class:`Batch`): a converge with nothing to do reads
the whole stack's state in one round trip while its operations run.
"""

from __future__ import annotations

import copy
import functools
import inspect
import secrets

from pyinfra import host
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.state import StateStage

from rigup import run as run_state



def _fact_key(fact, kwargs: dict) -> tuple:
    return fact.__module__, fact.__name__, repr(sorted(kwargs.items()))


def _run():
    """This run's facts read (``facts``: (host, operations run, fact) -> value) and named to read
    (``wanted``: host -> {fact key: (fact, kwargs)}, not read yet): rigup/run.py."""
    return run_state.host_run(host)


def will_read(fact, **kwargs) -> None:
    """An operation of this host will read ``fact`` with ``kwargs`` (through :func:`read_once`):
    the next read that misses reads it in the same round trip."""
    _run().wanted.setdefault(host.name, {})[_fact_key(fact, kwargs)] = (fact, kwargs)


def reading(fact, *same: str, **renamed: str):
    """Decorate an operation that reads ``fact``, with the fact's arguments ``same`` (the operation's
    arguments of the same names) and ``renamed`` (fact argument = the operation's argument's name):
    calling the operation (while the role's ``apply`` runs) names that read (:func:`will_read`);
    an argument left out is the operation's default."""
    names = {**{n: n for n in same}, **renamed}

    def wrap(op):
        if not getattr(op, "rigup_recorded", False):
            # below @operation() the read would be named only when the recorded call runs, after
            # apply: too late for the batch, and silently a round trip of its own
            raise TypeError(f"{op.__module__}.{op.__qualname__}: @reading goes above @operation() "
                            "(rigup.probe), on an operation")
        defaults = {n: p.default for n, p in inspect.signature(op).parameters.items()}

        @functools.wraps(op)
        def call(*args, **kwargs):
            will_read(fact, **{arg: kwargs.get(name, defaults.get(name)) for arg, name in names.items()})
            return op(*args, **kwargs)
        return call
    return wrap


def _now() -> tuple:
    """This host at this point of the run: how many of its operations have run commands."""
    return (host.name, sum(1 for op in host.state.ops[host].values() if op.operation_meta.executed))


def known(fact, value, **kwargs) -> None:
    """``value`` is what ``fact`` with ``kwargs`` reads on this host now: another fact's command read
    it too (preflight's HardwareFacts holds the NvidiaGpus value). A later :func:`read_once` of it,
    before an operation runs commands on the host, takes a copy from here instead of a round trip."""
    if host.state.current_stage in (StateStage.Prepare, StateStage.Execute):
        key = _fact_key(fact, kwargs)
        run = _run()
        run.facts[_now() + key] = copy.deepcopy(value)
        run.wanted.get(host.name, {}).pop(key, None)


def read_once(fact, **kwargs):
    """``host.get_fact(fact, **kwargs)``, read again only once an operation has run commands on
    the host. pyinfra 3 caches no fact; an operation's body may run more than once, and several
    operations of a role read the same state: a converge with nothing to do reads it once. A read
    that misses also reads every fact named by :func:`will_read` and not read yet."""
    if host.state.current_stage not in (StateStage.Prepare, StateStage.Execute):
        return host.get_fact(fact, **kwargs)
    base, run = _now(), _run()
    read, wanted = run.facts, run.wanted.setdefault(host.name, {})
    key = _fact_key(fact, kwargs)
    wanted.pop(key, None)
    if base + key not in read:
        reads = [(key, (fact, kwargs))] + [(k, v) for k, v in wanted.items() if base + k not in read]
        if len(reads) > 1:
            # a batch that fails as a whole leaves each fact to be read alone, as pyinfra would
            for k, value in host.get_fact(Batch, reads=[v for _, v in reads], _ignore_errors=True).items():
                read[base + reads[k][0]] = value
        if base + key not in read:    # alone, or its command failed in the batch: pyinfra's own read and errors
            read[base + key] = host.get_fact(fact, **kwargs)
    return read[base + key]


class Batch(FactBase):
    """``{i: value}`` for ``reads`` (``[(fact, kwargs), ...]``): each fact's own command, run one
    after another in one shell, and its own ``process`` on its part of the output (the reads of a
    fact with ``merge_by`` share one command: see :meth:`command`). A fact whose
    command fails (or whose required command is missing) is left out: the caller reads it alone,
    so that pyinfra reports it as it would."""

    def command(self, reads: list[tuple]) -> StringCommand:
        self.mark = f"##rigup-batch-{secrets.token_hex(6)}"
        self.facts, self.members = [], []
        merged: dict[tuple, int] = {}
        groups: list[tuple] = []   # (fact class, kwargs), one command each
        for i, (fact_cls, kwargs) in enumerate(reads):
            # reads of a fact with ``merge_by`` (its list argument; the value a dict keyed by its
            # items, as FileStates and ServiceStates) are one command over the union of their lists
            by = getattr(fact_cls, "merge_by", None)
            key = (fact_cls, repr(sorted((k, v) for k, v in kwargs.items() if k != by))) if by else None
            if key in merged:
                g = merged[key]
                groups[g][1][by] = list(dict.fromkeys([*groups[g][1][by], *kwargs[by]]))
                self.members[g].append(i)
                continue
            if key:
                merged[key] = len(groups)
            groups.append((fact_cls, dict(kwargs)))
            self.members.append([i])
        self.reads = reads
        parts: list = []
        for g, (fact_cls, kwargs) in enumerate(groups):
            fact = fact_cls()
            self.facts.append(fact)
            command = fact.command(**kwargs) if callable(fact.command) else fact.command
            required = fact.requires_command(**kwargs) if callable(fact.requires_command) else fact.requires_command
            if required:
                command = StringCommand("if command -v ", required, " >/dev/null 2>&1; then ( ", command,
                                        "\n); else false; fi", _separator="")
            # a line of its own after each command: it may end in a here-document's last line
            parts += [f"rigup_b{g}() {{ echo '{self.mark} {g}'; ( ", command, f"\n); echo '{self.mark} rc' $?; }}\n"]
        # The facts' commands run side by side (a host's cores: nvidia-smi, the model probe's
        # python3 and systemctl take 0.1-0.3 s each), each into a file of its own, printed in
        # order once all ended. A part whose "rc" line could not be written (a full /tmp) is left
        # out, so read alone. Without a temporary directory, they run one after another.
        if not groups:
            return StringCommand("true")
        ids = range(len(groups))
        files = " ".join(f'"$rigup_d/{g}"' for g in ids)
        parts += ["if rigup_d=$(mktemp -d 2>/dev/null); then ",
                  " ".join(f'rigup_b{g} > "$rigup_d/{g}" &' for g in ids), " wait; cat ", files,
                  ' 2>/dev/null; rm -rf "$rigup_d"; else ', "; ".join(f"rigup_b{g}" for g in ids),
                  "; fi; true"]
        return StringCommand(*parts, _separator="")

    def _values(self, g: int, value) -> dict:
        """``{i: value}`` for the reads of command ``g``: a merged read gets its own items only."""
        members = self.members[g]
        if len(members) == 1:
            return {members[0]: value}
        by = type(self.facts[g]).merge_by
        return {i: {k: value[k] for k in self.reads[i][1][by] if k in value} for i in members}

    @staticmethod
    def default() -> dict:
        return {}

    def process(self, output: list[str]) -> dict:
        values, lines, current = {}, [], None
        groups = [str(g) for g in range(len(self.facts))]
        for line in output:
            if not line.startswith(self.mark + " "):
                lines.append(line)
                continue
            # the host ran the command and so knows the mark: a line it echoes with another word, or an
            # rc outside a part, is no part's (an IndexError, ValueError or TypeError here ended the run)
            word = line[len(self.mark) + 1:].split()
            if word[:1] == ["rc"] and current is not None:
                fact = self.facts[current]
                if word[1:] == ["0"]:
                    try:
                        values.update(self._values(current, fact.process(lines) if lines else fact.default()))
                    except Exception:  # noqa: BLE001 (read alone, pyinfra reports it)
                        pass
                current, lines = None, []
            elif len(word) == 1 and word[0] in groups:
                current, lines = groups.index(word[0]), []
        return values
