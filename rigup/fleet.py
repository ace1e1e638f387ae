"""The fleet at a glance (status.py): one row per host, read in one round trip per host.

:class:`FleetStatus` runs one shell command made of sections (``##rigup-status:NAME`` then the
section's output): the cards (nvidia-smi, bounded), the llama.cpp build that serves (the
``current`` link), every serving unit (``rigup-llama@*``, ``rigup-vllm@*``: state, ``/health``
code at its port, the model revision of its drop-in), the GPU guard's tripped file, and any the
play adds (model_fetch's probe for the downloads). The ``parse_*`` functions and :func:`host_row`
are pure (tests/unit/test_fleet.py); :func:`record` keeps each host's row and :func:`report`
prints them all once, at exit, sorted by host name, with a row ``unreachable (reason)`` for each
host that could not be reached (heard by rigup.summary).
"""

from __future__ import annotations

import atexit
import json
import re
import shlex

import click
from pyinfra.api import FactBase

from rigup.gpu.catalogue import card_for
from rigup.gpu.plan import link_state
from rigup.gpu.facts import GPU_QUERY, parse_gpus, sections

MARK = "##rigup-status:"
SMI_TIMEOUT_S = 5
SMI = (f"if command -v nvidia-smi >/dev/null 2>&1; then timeout -k 1 {SMI_TIMEOUT_S} nvidia-smi "
       f"--query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>&1; echo \"smi_rc=$?\"; fi")
# Each serving unit's drop-in: its state, its --port and --host (read from the ExecStart line, kept to
# digits and address characters before they reach curl), /health's HTTP code there, and the model
# revision its comment records (roles/llama_server, roles/vllm: "..., model <revision>").
SERVING = r"""for d in /etc/systemd/system/rigup-llama@*.service.d /etc/systemd/system/rigup-vllm@*.service.d; do
  [ -d "$d" ] || continue; u=${d##*/}; u=${u%.d}; f=$d/rigup.conf
  port=$(grep -o -e '--port[= ][0-9]*' "$f" 2>/dev/null | head -n 1 | tr -cd 0-9)
  bind=$(grep -o -e '--host[= ][^ ]*' "$f" 2>/dev/null | head -n 1 | cut -c8- | tr -cd '0-9A-Za-z.:-')
  case $bind in ''|0.0.0.0|::) bind=127.0.0.1;; *:*) bind="[$bind]";; esac
  code=; [ -z "$port" ] || code=$(curl -s -o /dev/null -m 2 --noproxy '*' -w '%{http_code}' "http://$bind:$port/health" 2>/dev/null)
  echo "@@ $u"; echo "active=$(systemctl is-active "$u" 2>/dev/null)"; echo "port=$port"; echo "health=$code"
  echo "revision=$(sed -n 's/^# .*, model \([^ ,]*\)$/\1/p' "$f" 2>/dev/null | head -n 1)"
done; true"""
_UNIT = re.compile(r"rigup-(llama|vllm)@(.+)\.service")


def build_section(llama_cpp_dir: str) -> str:
    """The target of ``<llama_cpp_dir>/current`` (roles/llama_cpp switches it)."""
    return f"readlink {shlex.quote(llama_cpp_dir.rstrip('/') + '/current')} 2>/dev/null; true"


def guard_section(tripped_file: str) -> str:
    """``tripped`` and the file's JSON (roles/gpu_guard/guard.py) while the guard is tripped."""
    q = shlex.quote(tripped_file)
    return f"if [ -e {q} ]; then echo tripped; head -c 4096 {q} | tr -d '\\n'; echo; fi"


def status_command(parts: dict[str, str]) -> str:
    """One shell command: each section's marker, then its command in a subshell (a section may
    hold a here-document, so they are joined by newlines)."""
    return "\n".join(f"echo {shlex.quote(MARK + name)}\n(\n{command}\n)" for name, command in parts.items()) + "\ntrue"


class FleetStatus(FactBase):
    """The output of each section of ``parts`` ({name: shell}), as lines: {name: [line, ...]}."""

    default = dict

    def command(self, parts: dict[str, str]) -> str:
        return status_command(parts)

    def process(self, output: list[str]) -> dict[str, list[str]]:
        return sections(output, MARK)


# ----------------------------------------------------------------------------- parsers
def parse_cards(lines: list[str]) -> dict:
    """The gpus section -> ``{"cards": [{index, class, draw_w, limit_w, temp_c, vram_used_mib,
    vram_total_mib}], "lost": n, "smi": None | "missing" | "hung" | "failed (rc N)"}``."""
    rc_line = next((ln for ln in lines if ln.startswith("smi_rc=")), None)
    gpus = parse_gpus([ln for ln in lines if not ln.startswith("smi_rc=")])
    rc = int(rc_line[7:]) if rc_line and rc_line[7:].isdigit() else None
    smi = ("missing" if rc_line is None else "hung" if rc in (124, 137) else
           None if rc == 0 or gpus else f"failed (rc {rc})")
    cards = []
    for g in gpus:
        if g.get("lost"):
            continue
        card = card_for(g)
        cards.append({"index": g["index"], "class": card["class"] if card else (g.get("name") or "?"),
                      "draw_w": g.get("power_draw_w"), "limit_w": g.get("power_limit_w"),
                      "temp_c": g.get("temperature_c"), "vram_used_mib": g.get("memory_used_mib"),
                      "vram_total_mib": g.get("memory_total_mib"),
                      "link": link_state(g.get("pcie_gen"), g.get("pcie_gen_max"), g.get("pcie_width"),
                                         g.get("pcie_width_max"))})
    return {"cards": cards, "lost": sum(1 for g in gpus if g.get("lost")), "smi": smi}


def parse_serving(lines: list[str]) -> list[dict]:
    """The serving section -> ``[{"unit", "engine", "name", "active", "port", "health", "revision"}]``
    (port an int or None, health the HTTP code or None when nothing answered)."""
    out: list[dict] = []
    for line in lines:
        if line.startswith("@@ "):
            unit = line[3:].strip()
            m = _UNIT.fullmatch(unit)
            out.append({"unit": unit, "engine": m.group(1) if m else "?", "name": m.group(2) if m else unit,
                        "active": None, "port": None, "health": None, "revision": None})
        elif out and "=" in line:
            key, _, value = line.partition("=")
            value = value.strip()
            if key == "port":
                out[-1]["port"] = int(value) if value.isdigit() else None
            elif key == "health":
                out[-1]["health"] = int(value) if value.isdigit() and value != "000" else None
            elif key in ("active", "revision"):
                out[-1][key] = None if value in ("", "None") else value
    return out


def parse_guard(lines: list[str]) -> dict:
    """The guard section -> ``{"tripped": bool, "reason": str | None, "time": str | None}``."""
    if not any(ln.strip() == "tripped" for ln in lines):
        return {"tripped": False, "reason": None, "time": None}
    body = lines[lines.index("tripped") + 1:] if "tripped" in lines else []
    try:
        record = json.loads(body[0]) if body and body[0].strip() else {}
    except ValueError:
        record = {}
    record = record if isinstance(record, dict) else {}
    return {"tripped": True, "reason": record.get("reason") or "(no reason recorded)", "time": record.get("time")}


def parse_build(lines: list[str]) -> str | None:
    """The build section -> the target of ``current`` (``builds/b6123-3f2a...``), or None."""
    target = next((ln.strip() for ln in lines if ln.strip()), None)
    return target.rstrip("/").rsplit("/", 1)[-1] if target else None


# ----------------------------------------------------------------------------- rows
def tuned_text(entry: dict | None) -> str | None:
    """``tuned 1.84x at 4 concurrent`` of a ``llama_server_tuned`` entry (None: none, or no figures)."""
    if not isinstance(entry, dict) or not entry.get("tok_s") or not entry.get("baseline_tok_s"):
        return None
    return f"tuned {entry['tok_s'] / entry['baseline_tok_s']:.2f}x at {entry.get('concurrency') or '?'} concurrent"


def host_row(name: str, found: dict[str, list[str]], *, downloads: list[str], maintenance: bool,
             models: dict[str, str], tuned: dict | None = None) -> dict:
    """The row of reachable host ``name``: ``found`` is :class:`FleetStatus`'s value, ``downloads``
    one short line per model, ``models`` {instance name: its configured model} (for model@revision),
    ``tuned`` the host's ``llama_server_tuned`` (roles/llama_server/tuned.py)."""
    cards = parse_cards(found.get("gpus", []))
    serving = parse_serving(found.get("serving", []))
    for s in serving:
        s["model"] = f"{models.get(s['name'], '?')}@{(s['revision'] or '?')[:12]}"
        s["tuned"] = tuned_text((tuned or {}).get(s["name"]))
    return {"host": name, "reachable": True, "maintenance": maintenance, **cards,
            "build": parse_build(found.get("build", [])), "serving": serving,
            "downloads": downloads, "guard": parse_guard(found.get("guard", []))}


def unreachable_row(name: str, reason: str) -> dict:
    """The row of a host that could not be reached."""
    return {"host": name, "reachable": False, "reason": reason}


def _num(value, unit: str, digits: int = 0) -> str:
    return "?" if value is None else f"{value:.{digits}f}{unit}"


def cards_cell(row: dict) -> str:
    """``8x a100`` (``2x a100, 1x h100`` when mixed; ``+1 lost``; ``none``)."""
    counts: dict[str, int] = {}
    for c in row["cards"]:
        counts[c["class"]] = counts.get(c["class"], 0) + 1
    text = ", ".join(f"{n}x {cls}" for cls, n in counts.items()) or "none"
    if row.get("lost"):
        text += f" +{row['lost']} lost"
    if row.get("smi") and row["smi"] != "missing":
        text += f" (nvidia-smi {row['smi']})"
    slow = [f"GPU {c['index']} {c['link']['why']} DOWNTRAINED" for c in row["cards"]
            if (c.get("link") or {}).get("downtrained")]
    return text + (f" ({'; '.join(slow)})" if slow else "")


def power_cell(row: dict) -> str:
    """Per card ``draw/limit W temp C``: ``0:250/400W 61C 1:...``."""
    return " ".join(f"{c['index']}:{_num(c['draw_w'], '')}/{_num(c['limit_w'], 'W')} {_num(c['temp_c'], 'C')}"
                    for c in row["cards"]) or "-"


def vram_cell(row: dict) -> str:
    """VRAM used over all cards: ``12.0/320.0 GiB``."""
    used = [c["vram_used_mib"] for c in row["cards"] if c["vram_used_mib"] is not None]
    total = [c["vram_total_mib"] for c in row["cards"] if c["vram_total_mib"] is not None]
    return f"{sum(used) / 1024:.1f}/{sum(total) / 1024:.1f} GiB" if row["cards"] else "-"


def serving_cell(row: dict) -> str:
    """``gemma active :8081 200 gemma-270m@dc8aac109665``, one per instance, ``; ``-separated."""
    return "; ".join(f"{s['name']} {s['active'] or '?'} :{s['port'] or '?'} {s['health'] or '-'} {s['model']}"
                     + (f" ({s['tuned']})" if s.get("tuned") else "") for s in row["serving"]) or "-"


def guard_cell(row: dict) -> str:
    g = row["guard"]
    return f"TRIPPED {g['time'] or ''}: {g['reason']}".replace("  ", " ") if g["tripped"] else "ok"


COLUMNS = ("host", "cards", "power/limit temp", "vram", "build", "serving", "downloads", "guard", "maint")


def cells(row: dict) -> list[str]:
    """The table's cells of ``row``."""
    if not row["reachable"]:
        return [row["host"], f"unreachable ({row['reason']})"] + [""] * (len(COLUMNS) - 2)
    return [row["host"], cards_cell(row), power_cell(row), vram_cell(row), row["build"] or "-",
            serving_cell(row), "; ".join(row["downloads"]) or "-", guard_cell(row),
            "MAINTENANCE" if row["maintenance"] else "-"]


def render_table(rows: list[dict]) -> str:
    """Rows sorted by host name, columns aligned (an unreachable row spans the rest)."""
    table = [list(COLUMNS)] + [cells(r) for r in sorted(rows, key=lambda r: r["host"])]
    full = [t for t in table if not t[1].startswith("unreachable")]
    widths = [max(len(t[i]) for t in (table if i == 0 else full)) for i in range(len(COLUMNS))]
    lines = []
    for t in table:
        if t[1].startswith("unreachable"):
            lines.append(f"{t[0]:<{widths[0]}}  {t[1]}")
        else:
            lines.append("  ".join(f"{c:<{w}}" for c, w in zip(t, widths)).rstrip())
    return "\n".join(lines)


def render_json(rows: list[dict]) -> str:
    """``{"hosts": [row, ...]}`` sorted by host name."""
    return json.dumps({"hosts": sorted(rows, key=lambda r: r["host"])}, indent=1, sort_keys=True)


# ----------------------------------------------------------------------------- the run
_rows: dict[str, dict] = {}
_run: dict = {}


def record(state, row: dict, fmt: str) -> None:
    """Keep ``row`` for the report printed at exit (once, in format ``fmt``: table | json)."""
    if not _run:
        atexit.register(report)
    _run.update(state=state, fmt=fmt)
    _rows[row["host"]] = row


def report() -> None:
    """Print every host's row: those recorded, and an unreachable row for each host of the run
    that has none (its reason as rigup.summary heard it)."""
    from rigup import summary

    state = _run.get("state")
    rows = dict(_rows)
    if state is not None:
        for host in state.inventory:
            if host.name not in rows and state.is_host_in_limit(host):
                line = summary.host_line(state, host)
                reason = line.split("unreachable: ", 1)[1] if "unreachable: " in line else line.split("] ", 1)[-1]
                rows[host.name] = unreachable_row(host.name, reason)
    if _run.get("fmt") == "json":
        click.echo(render_json(list(rows.values())))
    else:
        click.echo(render_table(list(rows.values())))
