"""An OperationError's text and a no-op's line reach the terminal as pyinfra prints them, unescaped: one
that carries a host's text (a bus id from sysfs, nvidia-smi's answer, a build's log, a link's target)
goes through rigup.text.shown or shown_lines (round 5 A4: a bus id holding an OSC sequence reached
roles/nvidia_driver's ``loaded`` error; round 9 P1, C1, LC1: a build log's tail, the module probe's
line, a ``current`` link). Read from the syntax tree: each ``OperationError(X)`` (raised or returned)
and each ``host.noop(X)`` in rigup/, roles/ and the plays, with X neither a plain string nor a call of
``shown``/``shown_lines``; the rows below are those whose text carries no host text unchecked, each
with why (their counts may only fall). pyinfra's log is escaped once more on its way to the terminal
(rigup.text.TerminalFilter, tests/unit/test_terminal_filter.py): this guard keeps the texts right
where they are made."""

from __future__ import annotations

import ast
from pathlib import Path

from rigup.gpu.facts import parse_pci

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "the caller's words and configuration (names, paths, numbers)"
# (path, function, "raise" | "noop") -> (how many, why none carries a host's text unchecked)
ALLOWED: dict[tuple[str, str, str], tuple[int, str]] = {
    ("rigup/apt.py", "installed", "noop"): (1, "a count of packages"),
    ("rigup/files.py", "absent", "noop"): (1, CONFIG),
    ("rigup/files.py", "directory", "noop"): (1, CONFIG),
    ("rigup/files.py", "managed", "noop"): (1, CONFIG),
    ("rigup/firewall.py", "allowed", "noop"): (1, "rigup's table name"),
    ("rigup/firewall.py", "dropped", "noop"): (1, "rigup's table name"),
    ("rigup/gate.py", "answered", "noop"): (1, "the completion's answer as repr (!r escapes every character "
                                                "str.isprintable refuses)"),
    ("rigup/gate.py", "gate", "raise"): (3, "the answer and fail_on_log as !r, the journal through shown_lines; "
                                           "answered(), gate()'s one caller, logs them through shown/shown_lines"),
    ("rigup/gate.py", "stopped", "raise"): (1, "systemctl show's words (ActiveState, Result) and the journal through "
                                               "shown_lines: raised in gate(), logged by answered() through shown"),
    ("rigup/progress.py", "waited", "raise"): (2, CONFIG + " (the label, unit, log path, timeout)"),
    ("rigup/secrets.py", "secret_file", "noop"): (1, CONFIG),
    ("rigup/services.py", "running", "noop"): (2, CONFIG),
    ("rigup/serving.py", "retired", "noop"): (1, CONFIG),
    ("rigup/serving.py", "unit_running", "noop"): (2, CONFIG + " (its callers' unit names)"),
    ("plays/tuning.py", "_record", "raise"): (2, "rigup.boundary's Unreadable: each host value in it as !r"),
    ("rigup/units.py", "service_commands", "noop"): (1, CONFIG + " (its callers' unit and peer names)"),
    ("roles/balancer/__init__.py", "balanced", "noop"): (1, "a count of backends"),
    ("roles/balancer/__init__.py", "balanced", "raise"): (1, "the backends' names and addresses as repr"),
    ("roles/balancer/__init__.py", "frontends_answer", "noop"): (1, "a URL made of the configured bind and port"),
    ("roles/base/__init__.py", "system_user", "noop"): (1, CONFIG),
    ("roles/cuda_toolkit/__init__.py", "compiler_root_alone", "noop"): (1, "nvcc's path: configured, or a path of "
                                                                          "rigup.gpu.facts NAME_CHARS"),
    ("roles/cuda_toolkit/__init__.py", "version_present", "noop"): (1, CONFIG),
    ("roles/gpu_power/power.py", "limits_applied", "raise"): (1, "plan problems: uuids and bus ids as "
                                                                   "rigup.boundary.fields read them, the operator's keys"),
    ("roles/llama_cpp/build.py", "built", "noop"): (1, "the build id rigup made (roles/llama_cpp/script.py build_id)"),
    ("roles/llama_cpp/build.py", "switched", "raise"): (1, CONFIG + " (llama_cpp_dir)"),
    ("roles/llama_server/__init__.py", "instance", "noop"): (2, CONFIG + "; the unlock's wait: MiB counts"),
    ("roles/llama_server/__init__.py", "instance", "raise"): (1, "the marker's files as rigup.boundary.results marker "
                                                                 "reads them in rigup/units.py parse_instances "
                                                                 "(fields.inside: no control character)"),
    ("roles/model_fetch/__init__.py", "_wait", "raise"): (3, CONFIG + "; a job's end as rigup.boundary.hosttext "
                                                             "download_progress read it (its text through shown)"),
    ("roles/model_fetch/__init__.py", "fetched", "noop"): (1, "progress_line: host text through download_progress "
                                                              "(shown) or a marker typed by results.marker"),
    ("roles/model_fetch/__init__.py", "pruned_revisions", "noop"): (1, CONFIG),
    ("roles/model_fetch/__init__.py", "switched", "noop"): (1, CONFIG),
    ("roles/nvidia_driver/__init__.py", "loaded", "noop"): (1, "the driver's version, digits and dots "
                                                               "(rigup.gpu.facts parse_driver)"),
    ("roles/nvidia_driver/__init__.py", "packages_at_branch", "noop"): (1, CONFIG),
    ("roles/vllm/__init__.py", "install", "noop"): (1, CONFIG),
    ("roles/vllm/__init__.py", "instance", "noop"): (2, CONFIG + "; the unlock's wait: MiB counts"),
    ("roles/vllm/cluster.py", "installed", "noop"): (1, CONFIG + " (vllm_ray_version)"),
    ("tune.py", "not_swept", "raise"): (1, "plays.tuning differences: each installed value through shown"),
}
SHOWN = ("shown", "shown_lines")


def _kind(call: ast.Call) -> str | None:
    name = getattr(call.func, "id", getattr(call.func, "attr", None))
    return {"OperationError": "raise", "noop": "noop"}.get(name)


def unshown(root: Path = ROOT) -> dict[tuple[str, str, str], list[int]]:
    """(path, innermost function, kind) -> the lines of its texts not through shown, in ``root``'s
    rigup/, roles/ and plays (its own *.py)."""
    found: dict[tuple[str, str, str], list[int]] = {}
    files = [p for d in ("rigup", "roles", "plays", "shipped") for p in (root / d).rglob("*.py")] + list(root.glob("*.py"))
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        rel = str(path.relative_to(root))

        def visit(node: ast.AST, function: str) -> None:
            for child in ast.iter_child_nodes(node):
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                if isinstance(child, ast.Call) and _kind(child):
                    arg = child.args[0] if child.args else None
                    if not (isinstance(arg, ast.Constant) or
                            (isinstance(arg, ast.Call) and getattr(arg.func, "id", None) in SHOWN)):
                        found.setdefault((rel, function, _kind(child)), []).append(child.lineno)
                visit(child, inner)
        visit(tree, "<module>")
    return found


def test_an_operation_errors_text_and_a_noops_line_go_through_shown():
    found = unshown()
    over = {k: v for k, v in found.items() if len(v) > ALLOWED.get(k, (0, ""))[0]}
    print(f"OperationError and noop texts not through shown: {sum(map(len, found.values()))} at {len(found)} rows "
          f"(allowed rows: {len(ALLOWED)})")
    for key, lines in sorted(over.items()):
        print("  not allowed:", key, "lines", lines)
    assert not over, f"texts not through rigup.text.shown (pyinfra prints them unescaped): {over}"
    fewer = {k: len(found.get(k, [])) for k, (n, _) in ALLOWED.items() if len(found.get(k, [])) != n}
    assert not fewer, f"fewer such texts than ALLOWED says (lower its count, or drop the row): {fewer}"


def test_the_guard_reads_noops_returned_errors_and_plays(tmp_path):
    """The widened reader: a noop of host text, an OperationError returned (not raised), in a play or a
    nested function, count; shown's and shown_lines' do not."""
    (tmp_path / "roles" / "r").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "__init__.py").write_text(
        "def op(x):\n    host.noop(f'current is {x}')\n    host.noop(shown(x))\n    host.noop('plain')\n"
        "    return OperationError(f'{x}')\n")
    (tmp_path / "play.py").write_text(
        "def outer():\n    def inner(x):\n        raise OperationError(shown_lines(x))\n"
        "    raise OperationError('; '.join(x))\n")
    got = unshown(tmp_path)
    print("read:", got)
    assert got == {("roles/r/__init__.py", "op", "noop"): [2], ("roles/r/__init__.py", "op", "raise"): [5],
                   ("play.py", "outer", "raise"): [4]}


def test_sysfs_pci_lines_that_are_not_bus_and_device_ids_are_skipped():
    """Round 5 A4: a sysfs name with an OSC sequence and a device id of CSI were kept as cards."""
    got = parse_pci(["0000:07:00.0\x1b]0;owned\x07 0x20b2 0x030200", "0000:08:00.0 0x\x1b[2J 0x030200",
                     "../../etc 0x20b2 0x030200", "0000:08:00.0 0x20b2;rm 0x030200", "0000:09:00.0 0x20B2 0x030200"])
    print("read:", got)
    assert got == [{"bus_id": "0000:09:00.0", "pci_device_id": "10de:20b2"}]
