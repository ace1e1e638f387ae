"""A card's GEMM digest against its siblings on the other hosts (issue 62; pure on the records).

rigup-burnin compares the digests of the seeded GEMMs across the cards of one host (acceptance.py
``siblings``); a lone card, or a host whose cards all compute the same wrong result (one bad
cuBLAS build, a batch of cards alike), passes there. The controller keeps every host's records
(roles/burnin ``kept``: ``$RIGUP_CACHE_DIR/burnin/HOST.json``, read through rigup/boundary/burnin.py
``cached``), so each preflight compares this host's cards with the cards of the same key on the
others: the product (name, SM count), the driver, cuBLAS's version, and the operand type, the load
and the number of seeds (acceptance.py ``sibling_key``: digests of other GEMMs do not compare). Where
a strict majority of the hosts (one vote a host, this one included: :func:`odd_cards`) agree on one
digest, a passing card of this host that computed another is quarantined in the plan, naming both
digests and the hosts. The host's own record is left as it is: the verdict is the controller's, computed again at each
preflight from the copies, so a card whose siblings change (a host's copy removed) is judged again.
"""

from __future__ import annotations

from pathlib import Path

from rigup.boundary import Unreadable, burnin
from roles.burnin.shipped.acceptance import sibling_key
from roles.burnin.quarantine import named

PLAIN = (str, int, float, type(None))


def key_of(rec: object) -> tuple | None:
    """The record's sibling key and digest, or None where it has none comparable (no GEMM digest,
    or a field of the key that is not a plain value: records keep rigup-burnin's figures as written)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("gemm"), dict) or not isinstance(rec.get("key"), dict):
        return None
    digest, seeds = rec["gemm"].get("digest"), rec["gemm"].get("seeds")
    key = (*sibling_key(rec), seeds)
    if not isinstance(digest, str) or not digest or not all(isinstance(v, PLAIN) and not isinstance(v, bool) for v in key):
        return None
    return key, digest


def _ballots(records: dict, skip: set) -> dict[tuple, str]:
    """One host's vote per key (key -> digest): the digest a strict majority of its passing records
    of that key computed, leaving out the UUIDs in ``skip``; a key without one gets no vote."""
    tally: dict[tuple, dict[str, int]] = {}
    for uuid, rec in records.items():
        found = key_of(rec) if uuid not in skip and isinstance(rec, dict) and rec.get("passed") is True else None
        if found:
            tally.setdefault(found[0], {}).setdefault(found[1], 0)
            tally[found[0]][found[1]] += 1
    out = {}
    for key, counts in tally.items():
        digest, n = max(counts.items(), key=lambda d: d[1])
        if 2 * n > sum(counts.values()):
            out[key] = digest
    return out


def odd_cards(own: dict, others: dict[str, dict]) -> dict[str, str]:
    """{uuid: why} for this host's cards (``own``: uuid -> record) whose digest differs from the
    one a strict majority of the hosts computed for their key (``others``: host -> uuid -> record).

    One vote per host, not per record (a copy that lists twelve made-up cards outvoted four honest
    ones on two hosts): a host votes its own majority digest of the key's passing records, and this
    host votes too (two hosts that disagree cannot tell which is wrong). A copy that lists one of
    this host's own UUIDs is not a record of its own cards (a card sits in one machine): it does not
    vote; a UUID that two other copies both list is left out of both (which one holds it is unknown)."""
    mine = set(own)
    voters = {name: records for name, records in others.items() if not mine & set(records)}
    listed: dict[str, int] = {}
    for records in voters.values():
        for uuid in records:
            listed[uuid] = listed.get(uuid, 0) + 1
    twice = {uuid for uuid, n in listed.items() if n > 1}
    ballots = {name: _ballots(records, twice) for name, records in sorted(voters.items())}
    own_ballot = _ballots(own, set())
    out = {}
    for uuid, rec in own.items():
        found = key_of(rec) if rec.get("passed") is True and not rec.get("cleared") else None
        if not found:
            continue
        votes: dict[str, list[str]] = {}
        for name, ballot in ballots.items():
            if found[0] in ballot:
                votes.setdefault(ballot[found[0]], []).append(name)
        if not votes:
            continue
        total = sum(len(hosts) for hosts in votes.values()) + (found[0] in own_ballot)
        top, hosts = max(votes.items(), key=lambda d: len(d[1]))
        if found[1] == top or 2 * (len(hosts) + (own_ballot.get(found[0]) == top)) <= total:
            continue
        shown = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
        out[uuid] = (f"GEMM: digest {found[1][:16]} differs from {top[:16]}, what {len(hosts)} of the {total} "
                     f"hosts with this key ({shown}: same product, driver and cuBLAS; one vote a host, this one's "
                     "included) computed from the same seeded operands: wrong results")
    return out


def other_copies(copy: Path, hosts=None) -> dict[str, dict]:
    """The other hosts' records beside the controller's copy ``copy`` of this host's (host ->
    uuid -> record): each read through rigup.boundary.burnin.cached; one that does not read is
    left out (its own host's preflight refuses it, naming the file). ``hosts``: the inventory's
    names, whose copies alone count (round 6 BA20: two copies of hosts no longer in it quarantined
    a good card); None: every copy."""
    out, names = {}, None if hosts is None else set(hosts)
    try:
        paths = sorted(p for p in copy.parent.glob("*.json") if p.name != copy.name
                       and (names is None or p.stem in names))
    except OSError:
        return out
    for path in paths:
        try:
            got = burnin.cached(path)
        except Unreadable:
            continue
        if got:
            out[path.stem] = got.cards
    return out


def judge(records: dict, copy: Path, clear: list | None, hosts=None) -> dict:
    """``records`` (uuid -> record, the host's as roles/burnin judges them) with each card that
    :func:`odd_cards` names failed, its why added: quarantined by quarantine.py ``sort_cards``
    (``burnin_clear``, ``clear``, naming it or all: the operator accepts it)."""
    odd = {u: why for u, why in odd_cards(records, other_copies(copy, hosts)).items() if not named(clear, u)}
    return {u: ({**r, "passed": False, "failed": [*(r.get("failed") or []), odd[u]]} if u in odd else r)
            for u, r in records.items()}
