"""Pure decisions of roles/model_fetch: what each model's job fetches, what is refused, and the
progress lines. No pyinfra here: tested on plain data (tests/unit/test_model_fetch.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass, field

from rigup.names import HF_TOKEN, MARKER
from rigup.text import shown
from roles.model_fetch.shipped.fetcher import human, listing_problems, select, shard_problems

if TYPE_CHECKING:
    from rigup.models import ModelEntry

__all__ = ["human", "duration", "ModelPlan", "progress_line", "pending_note", "short_progress", "unsafe_files",
           "planted_problems", "plan_model"]

MiB = 1 << 20


def duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@dataclass
class ModelPlan:
    """One model on one host: ``action`` is complete | running | start | restart | refused |
    switch (a new revision complete in its own directory, not served yet)."""

    name: str
    action: str
    job: dict | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)   # (key path, why; fix)
    line: str = ""


def progress_line(name: str, state: dict) -> str:
    """``model big: 120.0 MiB / 256.0 MiB (46.9%), 40.0 MiB/s, ETA 3s (running)``."""
    marker = state.get("marker") or {}
    if state.get("complete"):
        return (f"model {name}: complete, {len(marker.get('files', []))} file(s), {human(marker.get('bytes', 0))} "
                f"at {state['dest']}")   # the marker typed (facts.py read_markers), each field optional
    serving = state.get("serving") or {}
    if state.get("staged"):
        return (f"model {name}: revision {str(marker.get('revision'))[:12]} complete at {state['where']}; "
                f"{state['dest']} switches to it from {str(serving.get('revision'))[:12]}")
    if serving:
        name = f"{name} (serving {str(serving.get('revision'))[:12]} meanwhile)"
    p = state.get("progress") or {}
    total = p.get("total") or 0
    done = p.get("bytes") or state.get("have_bytes") or 0
    pct = f" ({100 * done / total:.1f}%)" if total else ""
    if state.get("unreadable"):   # facts.py read_progress: a record that does not read, shown as such
        return (f"model {name}: progress unreadable ({shown(state['unreadable'])})"
                + (" (running)" if state.get("running") else ""))
    if state.get("running"):
        what = p.get("state") or "running"
        extra = f"; {p['detail']}" if p.get("detail") else ""
        return (f"model {name}: {human(done)} / {human(total)}{pct}, {human(p.get('rate') or 0)}/s, "
                f"ETA {duration(p.get('eta'))} ({what}{extra})")
    if state.get("damaged"):
        return f"model {name}: damaged since verified: {', '.join(state['damaged'][:5])}; fetched again"
    if p.get("state") == "failed":
        return f"model {name}: failed: {p.get('error')} (at {human(done)} / {human(total)}{pct})"
    if p:
        return f"model {name}: stopped at {human(done)} / {human(total)}{pct}; resumed"
    return f"model {name}: not here yet"


def pending_note(plan: ModelPlan, state: dict) -> str:
    """What the host's summary line says of a model this converge leaves downloading (a job it
    started or found running, not waited for): ``gemma: downloading 12.0% of 460.0 GiB, serving
    when complete: converge again, or watch status.py``; "" for any other plan."""
    if plan.action not in ("start", "restart", "running") or not plan.job:
        return ""
    total = plan.job["bytes"]
    done = min((state.get("progress") or {}).get("bytes") or state.get("have_bytes") or 0, total)
    serving = (state.get("serving") or {}).get("revision")
    then = (f"serving {serving[:12]} meanwhile, switching when complete" if serving
            else "serving when complete")
    return (f"{plan.name}: downloading {100 * done / total if total else 0:.1f}% of {human(total)}, {then}: "
            "converge again, or watch status.py")


def short_progress(name: str, state: dict) -> str:
    """A model's state in a few words, for status.py's table: ``gemma complete``, ``big 46.9%
    running``, ``big failed: No space left on device (at 12.0 MiB / 256.0 MiB)``."""
    if state.get("complete"):
        return f"{name} complete"
    if state.get("unreadable"):   # facts.py read_progress: a record that does not read, shown as such
        return f"{name} progress unreadable: {shown(state['unreadable'])}"
    p = state.get("progress") or {}
    total, done = p.get("total") or 0, p.get("bytes") or state.get("have_bytes") or 0
    at = f"{100 * done / total:.1f}%" if total else human(done)
    if state.get("running"):   # the job's detail: why it retries (the hub refusing, a cut), else nothing
        return f"{name} {at} {p.get('state') or 'running'}" + (f": {shown(p['detail'])}" if p.get("detail") else "")
    if p.get("state") == "failed":
        return f"{name} failed: {p.get('error')} (at {human(done)} / {human(total)})"
    return f"{name} stopped at {at}" if p else f"{name} not here yet"


def unsafe_files(files: list[dict], allow_unhashed: bool = False) -> list[tuple[str, str]]:
    """(path, why) of each thing wrong in the hub's listing (fetcher.listing_problems: an unsafe
    path, a bad size or hash, a path listed twice, no hash without ``allow_unhashed``)."""
    return listing_problems(files, allow_unhashed)


def planted_problems(where: str, state: dict) -> list[tuple[str, str]]:
    """(``WHERE.dest``, why) for each thing on the host that would make root follow what another
    user placed (fetcher.py ``planted`` and ``unsafe_parent``): nothing of the model is touched."""
    found = [(f"{where}.dest", f"{path} is {what}, which rigup never makes there: whoever can write that "
                               "directory (the rigup user) placed it; rigup touches nothing of this model while it "
                               "is there; fix: find out who made it, then remove it")
             for path, what in state.get("planted") or []]
    if state.get("unsafe_parent"):
        found.append((f"{where}.dest", f"{state['unsafe_parent']}: rigup makes a model's directory (as root) only "
                                       "under directories only root can write; fix: make them root's and not "
                                       "group- or world-writable, or set the dest (or models_dir) elsewhere"))
    return found


def plan_model(name: str, entry: ModelEntry, state: dict, *, endpoint: str, source: str, peer: str | None,
               workers: int, peer_wait: int, stall_s: int = 60, retries: int = 10) -> ModelPlan:
    """What to do for model ``name`` (a normalised ``models`` entry) given its probed ``state``."""
    where = f"models.{name}"
    line = progress_line(name, state) if state else f"model {name}: not probed"
    if "probe_error" in state:
        return ModelPlan(name, "refused", problems=[(where, f"the probe failed on the host: {state['probe_error']}")],
                         line=line)
    if state.get("marker_unreadable"):   # facts.py read_markers: what rigup-fetch itself never prints
        return ModelPlan(name, "refused", line=line, problems=[(f"{where}.dest", (
            f"the completion marker does not read ({shown(state['marker_unreadable'])}); fix: remove it "
            "(the model is fetched again), then converge again"))])
    hostile = planted_problems(where, state)
    if hostile:
        return ModelPlan(name, "refused", problems=hostile, line=line)
    if state.get("complete"):
        return ModelPlan(name, "complete", line=line)
    if state.get("staged"):  # complete in its revision's directory: switched to after the waits
        return ModelPlan(name, "switch", line=line)
    err = state.get("hub_error")
    repo, rev = entry["repo"], entry["revision"]
    if err:
        code = err.get("code")
        if code == "RevisionNotFound":
            why = (f"{rev} is not a commit of {repo} at {endpoint} ({err['message'][:200]}); "
                   "fix: pin a commit the repo has (its history on the hub lists them)")
            return ModelPlan(name, "refused", problems=[(f"{where}.revision", why)], line=line)
        if code in ("RepoNotFound", "GatedRepo") or err.get("status") in (401, 403, 404):
            why = (f"repo {repo!r} not found at {endpoint} ({err['message'][:200]}); fix: check the "
                   "name, or put a token with access in /etc/rigup/hf-token (model_fetch_hf_token_src)")
            return ModelPlan(name, "refused", problems=[(f"{where}.repo", why)], line=line)
        why = f"cannot list {repo}@{rev[:12]} at {endpoint}: {err['message'][:300]}; fix: check hf_endpoint"
        return ModelPlan(name, "refused", problems=[(where, why)], line=line)
    files = state.get("hub_files") or []
    hostile = unsafe_files(files, entry.get("allow_unhashed") is True)
    if hostile:  # a hostile or broken hub: no byte of this model, whatever include selects
        return ModelPlan(name, "refused", line=line, problems=[
            (f"{where}.repo", f"the hub at {endpoint} lists {path!r} in {repo}@{rev[:12]}: {why}; refused before any "
                              f"byte, nothing is written outside {entry['dest']}; fix: check hf_endpoint "
                              "(a mirror you trust) and the repo") for path, why in hostile])
    chosen, unmatched = select(files, entry["include"])
    problems = []
    sample = ", ".join(f["path"] for f in files[:6]) + (", ..." if len(files) > 6 else "")
    for pattern in unmatched:
        problems.append((f"{where}.include", f"pattern {pattern!r} matches no file of {repo}@{rev[:12]} "
                                             f"({len(files)} files: {sample}); fix: correct or remove it"))
    if not chosen and not unmatched:
        problems.append((where, f"{repo}@{rev[:12]} has no files"))
    for gap in shard_problems([f["path"] for f in chosen]):
        problems.append((f"{where}.include", f"selects an incomplete GGUF shard set: {gap}; fix: include "
                                             "every shard (e.g. 'name-*-of-0000N.gguf')"))
    total = sum(f["size"] for f in chosen)
    reused = state.get("reusable") or {}   # files of the revision served, hard-linked: no disk
    have = min((state.get("have_bytes") or 0) + sum(reused.get(f["path"], 0) for f in chosen), total)
    free = state.get("free_bytes")
    if not problems and free is not None and total - have > free:
        problems.append((f"{where}.dest", f"not enough free disk at {entry['dest']}: the download needs "
                                          f"{human(total - have)} more ({human(total)} in all, {human(have)} "
                                          f"already here, {total - have} bytes), {human(free)} free ({free} "
                                          f"bytes); fix: free {human(total - have - free)} there, or set "
                                          f"{where}.dest (or models_dir) to a filesystem with room"))
    if problems:
        return ModelPlan(name, "refused", problems=problems, line=line)
    where = state.get("where") or entry["dest"]
    job = {"name": name, "dest": where, "repo": repo, "revision": rev, "include": entry["include"],
           "endpoint": endpoint, "source": source, "peer": peer, "peer_wait": peer_wait, "workers": workers,
           "stall_s": stall_s, "retries": retries, "marker": MARKER, "token_file": HF_TOKEN,
           "allow_unhashed": entry.get("allow_unhashed") is True,
           "files": [{"path": f["path"], "size": f["size"], "oid": f.get("oid"), "sha256": f.get("sha256")}
                     for f in sorted(chosen, key=lambda f: f["path"])],
           "bytes": total}
    if where != entry["dest"]:
        job["reuse"] = entry["dest"]   # the revision served: its files the new one shares are linked
    if state.get("running"):
        old = state.get("job") or {}
        same = all(old.get(k) == job[k] for k in ("repo", "revision", "include", "source", "files"))
        return ModelPlan(name, "running" if same else "restart", job=job, line=line)
    return ModelPlan(name, "start", job=job, line=line)
