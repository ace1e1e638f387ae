"""Numbers read from text go through the boundary's one number rule (issue 61, class 3): rigup.boundary.numbers,
or in a host program (standard library only) its own copy of it, held equal by a Hypothesis test. ``int()``
and ``float()`` take ``"١٢"``, ``"1_000"``, ``" 12 "``, ``"1e400"`` (inf) and raise on ``"²"``; ``str.strip()``,
``str.split()`` with no argument take U+0085, U+00A0 and U+2028 as blanks, which the rule does not
(round 9 H1, H2, X1: ``"350\x85"`` was 350 in three readers that stripped before the rule).

Read from the syntax tree of every module of rigup/, roles/, inventory/ and the plays, outside rigup/boundary/:

- every ``int()``/``float()`` of a value that is not a literal nor arithmetic (a sum, a comparison,
  ``bool()``, ``len()``, ``min()``...) is on :data:`ALLOWED`, by function, with why it reads no outside
  text as it came (a regex of ASCII digits before it, a configuration value rigup.config typed, a
  record a typed reader returned, rigup's own file), or is one of the rule's copies (:data:`COPIES`);
- no ``.strip()``, ``.lstrip()``, ``.rstrip()`` or ``.split()`` without an argument feeds a number
  reader (``int``, ``float``, the rule and its copies), directly or through a name it was assigned
  to in the same function, but where :data:`STRIPPED` says why (or that it is still open);

a function's count on either list only goes down, and an entry whose calls are gone fails the test.
Round 2 found A11 (``int(text, 16)`` took ``0x4_1``), rigup/gate.py's ``_int`` (systemd's
``NRestarts=١``) and G11 (``--data 5_0_0``). tests/unit/test_outside_numbers.py holds ``str.isdigit()``
the same way."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the number readers: Python's, the boundary's and each host program's copy of the rule
READERS = {"int", "float", "number", "whole", "json_whole", "required", "shares", "figure", "reading", "_count", "_num",
           "_int"}
# calls whose value is no text: their int()/float() is arithmetic, not a reading
NOT_TEXT = {"bool", "len", "min", "max", "round", "abs", "sum", "time", "monotonic", "perf_counter"}
BARE = {"strip", "lstrip", "rstrip", "split"}
# calls of a name whose value is no part of their arguments' text (any other, as next() or min(), hands it on)
COUNTS = {"bool", "len", "round", "abs", "sum", "isinstance", "any", "all"}

CONFIG = "a configuration value rigup.config typed by its role's Form at the run's start (an int of YAML), or its default"
SPEC = "a value of a spec, record or entry rigup wrote or a typed reader returned (root's JSON; a normalised entry)"
REGEX = "a regex group of ASCII digits (or hex digits), fullmatched first"
TYPED = "a value already typed: a number numbers.number or a copy returned, a JSON number checked, or rigup's arithmetic"
OWN = "rigup's own file (catalogue.yml, xid.yml, a role's defaults.yml comment)"
CALLER = "an int rigup's own caller passes, made a shell word (a timeout, a nice level, a byte limit)"
ARGV = "rigup's own argv to a host program (the role wrote the command line)"
FORMAT = "a figure already a number, formatted for the operator or the text format"
CLI = "pyinfra_cli's parse_cli_arg, mirrored (tests/unit/test_inventory.py); rigup.config refuses what it misreads"
JSONHOOK = "json's parse_float hook: JSON's own number grammar (ASCII digits), a non-finite value refused"
COPY = "the number rule's copy in a host program (standard library only): see COPIES"
PROC = "the kernel's /proc/net/tcp, read as ASCII (errors replaced: no U+0085 in it); each cell regex-fullmatched first"
OPEN = ("OPEN (round 9, class 3): text from outside reaches int()/a number reader through int() or a bare "
        "strip/split; not in round 9's files, left for the lead to give out")

# the rule's copies in host programs: (path, function) -> the test that holds it to numbers.number
COPIES = {
    ("shipped/throughput.py", "figure"): "tests/unit/test_throughput.py::test_figure_is_numbers_number",
    ("roles/gpu_guard/shipped/guard.py", "reading"): "tests/unit/test_gpu_guard.py::test_a_reading_is_numbers_number_unsigned",
    ("roles/burnin/shipped/acceptance.py", "_num"): "tests/unit/test_burnin_round9.py::test_h3_num_is_the_boundarys_number_or_a_hex_word",
    ("roles/metrics/shipped/relay.py", "whole"): "tests/unit/test_boundary_readers_numbers.py::test_the_relays_whole_is_numbers_whole",
    ("roles/balancer/shipped/drain.py", "_count"): "tests/unit/test_boundary_readers_numbers.py::test_drains_count_is_numbers_whole",
}

# (path, function) -> (int()/float() calls allowed, why)
ALLOWED = {
    ("rigup/apt.py", "lock_timeout"): (1, CONFIG),
    ("rigup/apt.py", "waiting"): (1, CALLER),
    ("rigup/config.py", "parse_form"): (2, OWN),
    ("plays/fleet.py", "parse_loads"): (1, TYPED),
    ("rigup/gate.py", "journal_exit"): (1, REGEX),
    ("rigup/gate.py", "measured_tps"): (1, TYPED),
    ("shipped/gguf.py", "split_problem"): (1, REGEX),
    ("rigup/gpu/catalogue.py", "cuda_version"): (1, REGEX),
    ("rigup/gpu/catalogue.py", "driver_branches"): (1, OWN),
    ("rigup/gpu/catalogue.py", "xid_codes"): (1, OWN),
    ("rigup/gpu/catalogue.py", "version_tuple"): (1, REGEX),
    ("rigup/gpu/driver.py", "branch_of"): (1, REGEX),
    ("rigup/gpu/driver.py", "driver_step"): (3, CONFIG),
    ("rigup/gpu/facts.py", "_hex"): (1, REGEX),
    ("rigup/gpu/facts.py", "parse_listening_ports"): (1, REGEX),
    ("rigup/gpu/plan.py", "_card_plan"): (1, SPEC),
    ("shipped/xid.py", "events"): (2, REGEX),
    ("rigup/instances/vllm.py", "_family_layers"): (1, TYPED),
    ("rigup/instances/vllm.py", "partition_problem"): (1, REGEX),
    ("rigup/config.py", "cli_value"): (1, CLI),
    ("rigup/models.py", "first_gguf"): (1, REGEX),
    ("rigup/nofollow.py", "read_file"): (1, CALLER),
    ("rigup/progress.py", "start_command"): (2, CALLER),
    ("rigup/refusal.py", "watts_text"): (1, FORMAT),
    ("plays/roll.py", "batches"): (1, REGEX),
    ("shipped/throughput.py", "_rate"): (1, TYPED),
    ("shipped/throughput.py", "figure"): (2, COPY),
    ("shipped/throughput.py", "listener_may_read"): (2, REGEX),
    ("shipped/throughput.py", "main"): (1, ARGV),
    ("shipped/throughput.py", "server_figures"): (1, TYPED),
    ("plays/shipped/tune.py", "measure"): (4, SPEC),
    ("plays/shipped/tune.py", "spec_levels"): (1, SPEC),
    ("plays/shipped/tune.py", "stages"): (2, SPEC),
    ("plays/shipped/tune.py", "tune"): (2, SPEC),
    ("plays/tuning.py", "spec"): (4, CONFIG),
    ("rigup/units.py", "narrow"): (2, REGEX),
    ("rigup/units.py", "replica_port"): (1, SPEC),
    ("roles/balancer/shipped/drain.py", "_count"): (1, COPY),
    ("roles/balancer/shipped/drain.py", "_expired"): (1, TYPED),
    ("roles/balancer/shipped/drain.py", "run"): (4, ARGV),
    ("roles/burnin/__init__.py", "accepted"): (1, CONFIG),
    ("roles/burnin/shipped/acceptance.py", "_num"): (3, COPY),
    ("roles/burnin/shipped/acceptance.py", "expected_mib"): (1, REGEX),
    ("roles/burnin/shipped/acceptance.py", "finite"): (1, JSONHOOK),
    ("roles/burnin/shipped/acceptance.py", "pcie_allowed_gbps"): (2, TYPED),
    ("roles/burnin/shipped/acceptance.py", "write_metrics"): (1, TYPED),
    ("roles/burnin/shipped/acceptance.py", "xid_since"): (1, TYPED),
    ("roles/burnin/quarantine.py", "key_change"): (2, TYPED),
    ("roles/burnin/quarantine.py", "pulse_part"): (1, CONFIG),
    ("roles/gpu_guard/shipped/guard.py", "after_reboot"): (1, SPEC),
    ("roles/gpu_guard/shipped/guard.py", "debounce_of"): (2, SPEC),
    ("roles/gpu_guard/shipped/guard.py", "evaluate"): (1, SPEC),
    ("roles/gpu_guard/shipped/guard.py", "keep"): (3, SPEC),
    ("roles/gpu_guard/shipped/guard.py", "links_under_load"): (6, TYPED),
    ("roles/gpu_guard/shipped/guard.py", "metrics_text"): (1, TYPED),
    ("roles/gpu_guard/shipped/guard.py", "number"): (3, FORMAT),
    ("roles/gpu_guard/shipped/guard.py", "parse_sample"): (1, REGEX),
    ("roles/gpu_guard/shipped/guard.py", "reading"): (1, COPY),
    ("roles/gpu_guard/shipped/guard.py", "triage"): (4, SPEC),
    ("roles/gpu_power/checks.py", "check_psu_budget"): (1, TYPED),
    ("roles/gpu_power/policy.py", "_same"): (2, TYPED),
    ("roles/gpu_power/policy.py", "_w"): (1, FORMAT),
    ("roles/gpu_power/policy.py", "commands"): (1, TYPED),
    ("roles/gpu_power/policy.py", "config_lines"): (1, TYPED),
    ("roles/gpu_power/policy.py", "parse_clocks"): (4, REGEX),
    ("roles/gpu_power/policy.py", "power_plan"): (2, TYPED),
    ("roles/llama_cpp/shipped/smoke.py", "_decode_rate"): (1, TYPED),
    ("roles/llama_cpp/shipped/smoke.py", "attempt"): (1, SPEC),
    ("roles/llama_cpp/shipped/smoke.py", "compare"): (2, SPEC),
    ("roles/llama_cpp/shipped/smoke.py", "first_gguf"): (1, REGEX),
    ("roles/llama_cpp/shipped/smoke.py", "model_of"): (1, SPEC),
    ("roles/llama_cpp/shipped/smoke.py", "set_bytes"): (1, REGEX),
    ("roles/llama_cpp/smoke_model.py", "vocab"): (2, TYPED),
    ("roles/llama_server/command.py", "queue_limits"): (4, SPEC),
    ("roles/metrics/shipped/relay.py", "_finite"): (1, JSONHOOK),
    ("roles/metrics/shipped/relay.py", "lines"): (1, TYPED),
    ("roles/metrics/shipped/relay.py", "queue_lines"): (1, SPEC),
    ("roles/metrics/shipped/relay.py", "sample"): (2, REGEX),
    ("roles/metrics/shipped/relay.py", "whole"): (1, COPY),
    ("roles/model_fetch/shipped/fetcher.py", "do_GET"): (1, REGEX),
    ("roles/model_fetch/shipped/fetcher.py", "fetch"): (1, SPEC),
    ("roles/model_fetch/shipped/fetcher.py", "fetch_file"): (1, SPEC),
    ("roles/model_fetch/shipped/fetcher.py", "metrics_text"): (1, SPEC),
    ("roles/model_fetch/shipped/fetcher.py", "prune"): (1, SPEC),
    ("roles/model_fetch/shipped/fetcher.py", "range_problem"): (3, REGEX),
    ("roles/model_fetch/shipped/fetcher.py", "resume_point"): (1, SPEC),
    ("roles/model_fetch/shipped/fetcher.py", "shard_problems"): (2, REGEX),
    ("roles/model_fetch/shipped/fetcher.py", "share"): (1, SPEC),
    ("roles/model_fetch/plan.py", "duration"): (1, TYPED),
    ("roles/nvidia_driver/__init__.py", "apply"): (1, CONFIG),
    ("roles/nvidia_driver/__init__.py", "fabric_ready"): (2, CALLER),
    ("roles/nvidia_driver/__init__.py", "installed_elsewhere"): (1, CONFIG),
    ("roles/nvidia_driver/__init__.py", "packages_at_branch"): (3, CONFIG),
    ("roles/nvidia_driver/checks.py", "check_branch_cards"): (2, CONFIG),
    ("roles/nvidia_driver/checks.py", "check_distribution"): (1, CONFIG),
    ("roles/rpc_worker/__init__.py", "apply"): (1, CONFIG),
    ("roles/rpc_worker/__init__.py", "server"): (1, CONFIG),
    ("roles/rpc_worker/checks.py", "ports"): (1, CONFIG),
    ("roles/vllm/__init__.py", "_args"): (1, CONFIG),
    ("roles/vllm/checks.py", "ports"): (3, CONFIG),
    ("roles/vllm/checks.py", "replica_groups"): (1, SPEC),
    ("roles/vllm/cluster.py", "argv"): (2, CONFIG),
    ("roles/vllm/cluster.py", "gcs"): (1, CONFIG),
    ("roles/vllm/cluster.py", "node_ports"): (5, CONFIG),
    ("roles/vllm/cluster.py", "port_flags"): (3, CONFIG),
    ("roles/vllm/cluster.py", "unit_text"): (1, CONFIG),
    ("roles/vllm/shipped/ray_wait.py", "alive_nodes"): (1, ARGV),
    ("roles/vllm/shipped/ray_wait.py", "main"): (1, ARGV),
    ("roles/watchdog/__init__.py", "watched"): (1, SPEC),
    ("roles/watchdog/shipped/watchdog.py", "gate_record"): (2, TYPED),
    ("roles/watchdog/shipped/watchdog.py", "metrics_text"): (1, SPEC),
    ("roles/watchdog/shipped/watchdog.py", "servers"): (1, REGEX),
    ("tune.py", "sweep"): (1, CONFIG),
}

# (path, function) -> (bare strips or splits feeding a number reader allowed, why)
STRIPPED = {
    ("rigup/config.py", "parse_form"): (2, OWN),
    ("shipped/throughput.py", "listener_may_read"): (2, PROC),
}


def _name(func: ast.AST) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _bare(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in BARE \
        and not node.args and not node.keywords


def _stripped(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node``'s value is (a part of) a bare strip's or split's text: the call itself, a name
    assigned one, a subscript, a method of one, a comprehension or choice of them, or a call of a name
    (next, min, sorted...) given one."""
    if _bare(node):
        return True
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Subscript):
        return _stripped(node.value, names)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        return not (isinstance(owner, ast.Name) and owner.id in ("re", "json", "os", "math")) and _stripped(owner, names)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in READERS | COUNTS:
        # next(), min(), sorted()... hand on their arguments' text (round 10 N1: next(ln.strip() for ...))
        return any(_stripped(a, names) for a in node.args)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        inner = names | {n.id for g in node.generators if _stripped(g.iter, names)
                         for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        return _stripped(node.elt, inner)
    if isinstance(node, ast.IfExp):
        return _stripped(node.body, names) or _stripped(node.orelse, names)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_stripped(e, names) for e in node.elts)
    if isinstance(node, ast.BoolOp):
        return any(_stripped(v, names) for v in node.values)
    return False


def _text_like(arg: ast.AST) -> bool:
    if isinstance(arg, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare)):
        return False
    return not (isinstance(arg, ast.Call) and _name(arg.func) in NOT_TEXT)


def _own(node: ast.AST):
    """The nodes of ``node``'s body, not of the functions defined in it."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield child
            yield from _own(child)


def calls() -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """({(path, function): int()/float() calls of a value that may be text}, {(path, function): number
    readers fed a bare strip's or split's text}) over rigup/, roles/, inventory/ and the plays, outside rigup/boundary/."""
    converts: dict[tuple[str, str], int] = {}
    strips: dict[tuple[str, str], int] = {}
    sources = [p for d in ("rigup", "roles", "plays", "shipped", "inventory") for p in (ROOT / d).rglob("*.py")] + list(ROOT.glob("*.py"))
    for path in sorted(sources):
        rel = str(path.relative_to(ROOT))
        if rel.startswith("rigup/boundary/"):
            continue
        tree = ast.parse(path.read_text(), rel)
        functions = [(n.name, n) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for name, function in functions + [("<module>", tree)]:
            nodes = list(_own(function))
            names: set[str] = set()
            for node in nodes * 2:   # twice: a name assigned from another assigned later in the text
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None \
                        and _stripped(node.value, names):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                if isinstance(node, (ast.For, ast.comprehension)) and _stripped(node.iter, names):
                    names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            for node in nodes:
                if not (isinstance(node, ast.Call) and node.args and _name(node.func) in READERS):
                    continue
                if isinstance(node.func, ast.Name) and node.func.id in ("int", "float") and _text_like(node.args[0]):
                    converts[(rel, name)] = converts.get((rel, name), 0) + 1
                if any(_stripped(a, names) for a in node.args):
                    strips[(rel, name)] = strips.get((rel, name), 0) + 1
    return converts, strips


def test_the_readers_convert_numbers_only_where_a_reason_says_so():
    converts, _ = calls()
    print("\n" + "\n".join(f"{p} {f}: {n}" for (p, f), n in sorted(converts.items())))
    over = {k: n for k, n in converts.items() if n > ALLOWED.get(k, (0, ""))[0]}
    assert not over, (f"int()/float() of a value that may be text (they take '١٢', '1_000' and '1e400', raise on "
                      f"'²'): {over}; read it with rigup.boundary.numbers (number, whole), or a host program's copy")


def test_no_bare_strip_or_split_feeds_a_number_reader():
    """Round 9 H1, H2, X1: str.strip() before the rule took U+0085 ("350\\x85" read 350)."""
    _, strips = calls()
    print("\n" + "\n".join(f"{p} {f}: {n}" for (p, f), n in sorted(strips.items())))
    over = {k: n for k, n in strips.items() if n > STRIPPED.get(k, (0, ""))[0]}
    assert not over, (f"a bare .strip()/.split() feeds a number reader (they take U+0085, U+00A0, U+2028): {over}; "
                      "strip ASCII's blanks alone (' \\t\\r\\n\\f\\v'), or leave it to numbers.number")


def test_the_allow_lists_name_only_what_is_there():
    converts, strips = calls()
    assert not [k for k in ALLOWED if k not in converts], "an ALLOWED entry whose calls are gone: remove it"
    assert not [k for k in STRIPPED if k not in strips], "a STRIPPED entry whose strips are gone: remove it"
    print(f"{sum(n for n, _ in ALLOWED.values())} int()/float() calls allowed in {len(ALLOWED)} functions; "
          f"{sum(n for n, why in STRIPPED.values() if why == OPEN)} bare strips still open: "
          f"{sorted(k for k, (_, why) in STRIPPED.items() if why == OPEN)}")


def test_each_copy_of_the_rule_is_held_to_it_by_a_test():
    for (path, function), test in COPIES.items():
        assert ALLOWED.get((path, function), (0, ""))[1] == COPY, (path, function)
        file, _, name = test.partition("::")
        source = (ROOT / file).read_text()
        assert f"def {name}(" in source and "rigup.boundary.numbers" in source, test
    assert not [k for k, (_, why) in ALLOWED.items() if why == COPY and k not in COPIES]


# the two whole-number copies (relay, drain) held to numbers.whole here
from hypothesis import given, settings, strategies as st  # noqa: E402

from rigup.boundary.numbers import whole  # noqa: E402

WHOLE_TEXT = st.one_of(st.text(st.sampled_from(list("0123456789+-._e \t\r\n\x0b\x0c\x85\xa0\u2003\u2028\u0663\u00b2")),
                               max_size=21),
                       st.sampled_from(["0080", "\u0663", "1_0", "1e3", "nan", "inf", " 80", "80\x85", "9" * 19, "True",
                                        "-0", "+5", "0", "65535"]))


@settings(max_examples=300, deadline=None)
@given(text=WHOLE_TEXT)
def test_the_relays_whole_is_numbers_whole(text):
    from roles.metrics.shipped import relay
    assert relay.whole(text) == whole(text), text


@settings(max_examples=300, deadline=None)
@given(text=WHOLE_TEXT)
def test_drains_count_is_numbers_whole(text):
    """drain's _count takes no blanks at all (its callers give it a cell): where it reads a number,
    the boundary reads the same one."""
    from roles.balancer.shipped import drain
    got = drain._count(text)
    assert got is None or got == whole(text), text
    assert got == whole(text) or text != text.strip(" \t\r\n\f\v"), text
