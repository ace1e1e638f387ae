"""rigup/gate.py: a serving unit's crash or exit named at once from ``systemctl show`` (captured
text of systemd 252, Debian 12, as the probe prints it with its Jobs= and Health= lines), known
traps matched to a crash's signal, the CPU fallback found anywhere in the journal of this start,
and a timeout on every remote command; the gate itself against a scripted host."""

import shlex
import time
from pathlib import Path
from dataclasses import dataclass, field
from types import MappingProxyType, SimpleNamespace

import pytest
from pyinfra.api import OperationError

from rigup import gate as g

UNIT = "rigup-llama@gemma.service"
INV = "8d2f1c0c3b8e4a6f9b1e2d3c4b5a6978"
NEW_INV = "0f1e2d3c4b5a69788d2f1c0c3b8e4a6f"

# Loading: the start job runs its ExecStartPre (test -r MODEL); systemd zeroed ExecMain* at the start.
START_PRE = f"""Result=success
NRestarts=0
ExecMainStartTimestampMonotonic=0
ExecMainExitTimestampMonotonic=0
ExecMainCode=0
ExecMainStatus=0
ActiveState=activating
SubState=start-pre
InvocationID={INV}
Jobs=1
Health=000
"""
# Type=exec: active as soon as llama-server is exec'd; /health 503 while it loads the model.
LOADING = f"""Result=success
NRestarts=0
ExecMainStartTimestampMonotonic=1834561234
ExecMainExitTimestampMonotonic=0
ExecMainCode=0
ExecMainStatus=0
ActiveState=active
SubState=running
InvocationID={INV}
Jobs=0
Health=503
"""
SERVING = LOADING.replace("Health=503", "Health=200")
# SIGSEGV 0.6 s after its start, core dumped; Restart=on-failure, RestartSec=10: auto-restart, no job yet.
SEGV = f"""Result=core-dump
NRestarts=0
ExecMainStartTimestampMonotonic=1834561234
ExecMainExitTimestampMonotonic=1835163456
ExecMainCode=3
ExecMainStatus=11
ActiveState=activating
SubState=auto-restart
InvocationID={INV}
Jobs=0
Health=000
"""
# Killed by SIGABRT (no core: LimitCORE=0), the unit out of restarts (StartLimitBurst): failed.
ABRT_FAILED = SEGV.replace("Result=core-dump", "Result=signal").replace("ExecMainCode=3", "ExecMainCode=2") \
    .replace("ExecMainStatus=11", "ExecMainStatus=6").replace("ActiveState=activating", "ActiveState=failed") \
    .replace("SubState=auto-restart", "SubState=failed")
# exit(1) 2.5 s after its start (a bad flag, a model it cannot read).
EXIT_1 = SEGV.replace("Result=core-dump", "Result=exit-code").replace("ExecMainCode=3", "ExecMainCode=1") \
    .replace("ExecMainStatus=11", "ExecMainStatus=1") \
    .replace("ExecMainExitTimestampMonotonic=1835163456", "ExecMainExitTimestampMonotonic=1837061234")
# Restarted by systemd since (RestartSec elapsed): a new invocation in its ExecStartPre, the record zeroed.
RESTARTED = START_PRE.replace("NRestarts=0", "NRestarts=1").replace(INV, NEW_INV)
# The previous start's state while rigup's `restart --no-block` job waits: not this start's.
QUEUED_OLD_FAILURE = SEGV.replace("Jobs=0", "Jobs=1")
# ExecStartPre (rigup's RPC wait) failed: no main process ran.
PRE_FAILED = START_PRE.replace("Result=success", "Result=exit-code").replace("SubState=start-pre", "SubState=auto-restart") \
    .replace("Jobs=1", "Jobs=0")
# The guard file is there (ConditionPathExists=!): the start was skipped.
SKIPPED = START_PRE.replace("ActiveState=activating", "ActiveState=inactive").replace("SubState=start-pre", "SubState=dead") \
    .replace("Jobs=1", "Jobs=0")
JOURNAL_SEGV = """rigup-llama@gemma.service: Scheduled restart job, restart counter is at 1.
Started llama-server gemma (rigup).
rigup-llama@gemma.service: Main process exited, code=dumped, status=11/SEGV
rigup-llama@gemma.service: Failed with result 'core-dump'.
"""
JOURNAL_PRE = "rigup-llama@gemma.service: Control process exited, code=exited, status=1/FAILURE\n"


def props(text):
    return g.parse_show(text)


def test_parse_show_reads_the_probe():
    p = props(SEGV)
    assert p["Result"] == "core-dump" and p["ExecMainStatus"] == "11" and p["Jobs"] == "0" and p["Health"] == "000"
    assert p["InvocationID"] == INV and g.parse_show("") == {}


def test_probe_is_one_command_with_the_state_jobs_and_health():
    command = g.probe_command(UNIT, "http://127.0.0.1:8081")
    assert command.count("systemctl show") == 1 and all(f"-p {p} " in command for p in g.SHOW)
    assert "list-jobs --no-legend rigup-llama@gemma.service" in command and "http://127.0.0.1:8081/health" in command


@pytest.mark.parametrize("now, first, gone", [
    (START_PRE, START_PRE, False), (LOADING, START_PRE, False), (SERVING, START_PRE, False),
    (SEGV, START_PRE, True), (SEGV, SEGV, True),                # crashed before the gate's first poll
    (ABRT_FAILED, START_PRE, True), (EXIT_1, LOADING, True), (PRE_FAILED, START_PRE, True),
    (SKIPPED, SKIPPED, True),
    (RESTARTED, LOADING, True),                                  # restarted since the gate started
    (RESTARTED, RESTARTED, False),                               # restarted before it: judged by what comes
    (QUEUED_OLD_FAILURE, QUEUED_OLD_FAILURE, False),             # rigup's start job has not run yet
    ("", START_PRE, False),                                      # a probe that failed or timed out
])
def test_ended(now, first, gone):
    assert g.ended(props(now), props(first)) is gone


def test_main_exit_from_systemctl_show():
    assert g.main_exit(props(LOADING)) is None and g.main_exit(props(START_PRE)) is None
    segv = g.main_exit(props(SEGV))
    assert (segv.code, segv.status, segv.signal, segv.result) == ("dumped", 11, "SIGSEGV", "core-dump")
    assert segv.after == pytest.approx(0.602222)
    assert g.main_exit(props(ABRT_FAILED)).signal == "SIGABRT"
    one = g.main_exit(props(EXIT_1))
    assert (one.code, one.status, one.signal, one.after) == ("exited", 1, None, 2.5)


def test_journal_exit_reads_systemds_last_line():
    segv = g.journal_exit(JOURNAL_SEGV)
    assert (segv.code, segv.status, segv.name, segv.signal, segv.main, segv.after) == ("dumped", 11, "SEGV", "SIGSEGV", True, None)
    pre = g.journal_exit(JOURNAL_PRE)
    assert (pre.code, pre.status, pre.name, pre.main) == ("exited", 1, "FAILURE", False)
    assert g.journal_exit("Started llama-server gemma (rigup).\n") is None


def test_signal_names():
    assert g.signal_name(11) == "SIGSEGV" and g.signal_name(6) == "SIGABRT" and g.signal_name(250) == "signal 250"
    assert g._signal("SEGV") == g._signal("sigsegv") == g._signal("11") == "SIGSEGV"


def reason(text, phase=g.LOADING, first=START_PRE, exit_=None):
    now = props(text)
    restarts = int(now["NRestarts"]) - int(props(first)["NRestarts"])
    return g.stopped_reason(UNIT, "llama-server", now, exit_ or g.main_exit(now), phase, restarts)


def test_reasons():
    assert reason(SEGV, g.INFERENCE) == ("rigup-llama@gemma.service: llama-server crashed (SIGSEGV, core dumped) "
                                         "0.6 s after start, during its first inference")
    assert reason(SEGV) == "rigup-llama@gemma.service: llama-server crashed (SIGSEGV, core dumped) 0.6 s after start, while loading"
    assert reason(ABRT_FAILED) == "rigup-llama@gemma.service: llama-server crashed (SIGABRT) 0.6 s after start, while loading"
    assert reason(EXIT_1) == "rigup-llama@gemma.service: llama-server exited with status 1 2.5 s after start, while loading"
    oom = SEGV.replace("Result=core-dump", "Result=oom-kill").replace("ExecMainCode=3", "ExecMainCode=2") \
        .replace("ExecMainStatus=11", "ExecMainStatus=9").replace("ExecMainExitTimestampMonotonic=1835163456",
                                                                   "ExecMainExitTimestampMonotonic=1954561234")
    assert reason(oom) == "rigup-llama@gemma.service: llama-server was killed (SIGKILL, out of memory) 120 s after start, while loading"
    assert reason(RESTARTED, g.INFERENCE, exit_=g.journal_exit(JOURNAL_SEGV)) == (
        "rigup-llama@gemma.service: llama-server crashed (SIGSEGV, core dumped), during its first inference; "
        "systemd restarted it (1x since the gate started)")
    assert reason(RESTARTED, exit_=None) == ("rigup-llama@gemma.service: llama-server stopped while loading; "
                                             "systemd restarted it (1x since the gate started)")


def test_reasons_that_keep_the_health_wording():
    """A start-up command's failure (rigup's RPC wait) and a skipped start keep "/health did not answer 200"
    (tests/roles/test_rpc.py reads it)."""
    assert reason(PRE_FAILED, exit_=g.journal_exit(JOURNAL_PRE)) == (
        "rigup-llama@gemma.service: /health did not answer 200 (the unit failed: a start-up command exited "
        "with status 1 (FAILURE))")
    assert reason(SKIPPED) == "rigup-llama@gemma.service: /health did not answer 200 (the unit failed: inactive (dead))"
    assert reason(PRE_FAILED) == ("rigup-llama@gemma.service: /health did not answer 200 (the unit failed: "
                                  "activating (auto-restart), result exit-code)")


@dataclass(frozen=True)
class Remedy:
    kind: str
    value: str | None
    fix: str


@dataclass(frozen=True)
class Trap:   # as rigup/traps.py's
    id: str
    ref: str
    summary: str
    condition: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    remedy: Remedy = Remedy("refuse", None, "")


def test_traps_matched_by_signal():
    segv = Trap("repack-segv", "https://github.com/ggml-org/llama.cpp/issues/1", "CPU repack crashes at the first batch",
                MappingProxyType({"signal": "SIGSEGV"}), Remedy("server_flag", "--no-repack", "add --no-repack"))
    abrt = Trap("cuda-oom-abort", "002_x.txt", "a CUDA OOM aborts", MappingProxyType({"signal": "SIGABRT"}),
                Remedy("refuse", None, "lower ctx"))
    other = Trap("fa-kv", "003_y.txt", "no FA kernel", MappingProxyType({"flash_attn": ["on"]}), Remedy("refuse", None, "x"))
    listed = {"id": "segv-any", "ref": "004_z.txt", "summary": "either", "condition": {"signal": ["SEGV", "SIGBUS"]},
              "remedy": {"fix": "rebuild"}}
    plain = ("picked", "the caller's pick for this unit", "pin the build")
    hints = g.trap_hints([segv, abrt, other, listed, plain], "SIGSEGV")
    assert hints == [
        "known trap that may match: repack-segv (https://github.com/ggml-org/llama.cpp/issues/1): "
        "CPU repack crashes at the first batch; fix: add --no-repack",
        "known trap that may match: segv-any (004_z.txt): either; fix: rebuild",
        "known trap that may match: picked: the caller's pick for this unit; fix: pin the build"]
    assert g.trap_hints([abrt], "SIGABRT")[0].startswith("known trap that may match: cuda-oom-abort (002_x.txt)")
    assert g.trap_hints([segv, plain], None) == [] and g.trap_hints(None, "SIGSEGV") == []
    from rigup import traps   # the catalogue as roles/llama_cpp/traps.yml writes it: condition.signals
    repack = traps.load(Path(__file__).resolve().parents[2] / "roles/llama_cpp/traps.yml", ["signals", "cpu_flags_any"])
    assert [h.split(":")[1].split("(")[0].strip() for h in g.trap_hints(repack, "SIGSEGV")] == ["cpu-repack-crash"]
    ns = SimpleNamespace(id="ns", summary="duck", condition={"signal": 11}, fix="f")   # no ref, fix on the trap
    assert g.trap_hints([ns], "SIGSEGV") == ["known trap that may match: ns: duck; fix: f"]


def test_journal_and_search_commands():
    assert g.journal_command(UNIT) == "journalctl -u rigup-llama@gemma.service -n 40 --no-pager -o cat"
    assert g.journal_command(UNIT, "not; an id") == g.journal_command(UNIT)
    command = g.journal_command(UNIT, INV)
    assert f"journalctl -q _SYSTEMD_INVOCATION_ID={INV} -o cat --no-pager -n 60" in command and "-u rigup-llama@gemma.service -n 40" in command
    search = g.log_search_command(UNIT, INV, "no usable GPU found")
    assert f"journalctl -q _SYSTEMD_INVOCATION_ID={INV} -o cat --no-pager;" in search   # the whole start
    assert search.endswith("| grep -F -m1 -- 'no usable GPU found'")
    assert "'it'\"'\"'s'" in g.log_search_command(UNIT, INV, "it's")


# -- the gate against a scripted host ---------------------------------------------------------------------

class Host:
    """Answers the gate's commands from scripts: ``probes`` (systemctl show text, or TimeoutError),
    one per poll; the last repeats. Keeps every command and its timeout."""

    def __init__(self, probes, completion="", journal="llama-server: loading\n", exits="", found=""):
        self.probes, self.completion, self.journal, self.exits = list(probes), completion, journal, exits
        self.found, self.calls = found, []

    def run_shell_command(self, command, print_output=False, print_input=False, _timeout=None):
        bits = [str(b) for b in command.bits]
        assert bits[:3] == ["timeout", "-k", "5"] and bits[4:6] == ["bash", "-c"] and _timeout == int(bits[3]) + 5
        script = shlex.split(bits[6])[0]
        self.calls.append((script, _timeout))
        out = ""
        if script.startswith("systemctl show"):
            step = self.probes.pop(0) if len(self.probes) > 1 else self.probes[0]
            if step is TimeoutError:
                raise TimeoutError()
            out = step
        elif "chat/completions" in script:
            out = self.completion
        elif "process exited" in script:
            out = self.exits
        elif "grep -F -m1" in script:
            out = self.found
        elif "journalctl" in script:
            out = self.journal
        return True, SimpleNamespace(stdout=out)

    def scripts(self, word):
        return [s for s, _ in self.calls if word in s]


def run_gate(host, **kw):
    kw = {"timeout": 20, "poll": 0.01, **kw}
    start = time.monotonic()
    try:
        return g.gate(host, UNIT, 8081, "gemma", "Hi", **kw), time.monotonic() - start
    except OperationError as e:
        return e, time.monotonic() - start


ANSWER = '{"choices": [{"message": {"content": "Paris"}}], "timings": {"predicted_per_second": 80.5}}'


def test_a_crash_while_loading_is_named_at_once_with_its_journal_and_traps():
    trap = Trap("repack-segv", "001_a.txt", "repack crash", MappingProxyType({"signal": "SIGSEGV"}), Remedy("server_flag", "--no-repack", "add --no-repack"))
    host = Host([START_PRE, START_PRE, SEGV], journal="load_tensors: loading model\nSegmentation fault\n")
    e, seconds = run_gate(host, traps=[trap], timeout=600)
    reason, _, journal = str(e).partition("\n")
    print(f"\n{reason}\n{journal}")
    assert seconds < 2 and reason == ("rigup-llama@gemma.service: llama-server crashed (SIGSEGV, core dumped) 0.6 s "
                                      "after start, while loading; known trap that may match: repack-segv (001_a.txt): "
                                      "repack crash; fix: add --no-repack")
    assert journal == "load_tensors: loading model\nSegmentation fault\n"
    assert f"_SYSTEMD_INVOCATION_ID={INV}" in host.scripts("journalctl")[-1]
    assert len(host.scripts("systemctl show")) == 3 and not host.scripts("process exited")


def test_a_crash_under_the_first_completion_is_during_its_first_inference():
    host = Host([LOADING, SERVING, SEGV], completion="")
    e, seconds = run_gate(host)
    assert str(e).startswith("rigup-llama@gemma.service: llama-server crashed (SIGSEGV, core dumped) 0.6 s after start, "
                             "during its first inference\n")


def test_a_crash_systemd_already_restarted_is_read_from_its_journal():
    host = Host([LOADING, RESTARTED], exits="rigup-llama@gemma.service: Main process exited, code=dumped, status=11/SEGV\n")
    e, _ = run_gate(host)
    assert str(e).startswith("rigup-llama@gemma.service: llama-server crashed (SIGSEGV, core dumped), while loading; "
                             "systemd restarted it (1x since the gate started)\n")
    assert "journalctl -u rigup-llama@gemma.service -n 40" in host.scripts("journalctl")[-1]   # the new start's is not it


def test_a_plain_exit_is_named_not_waited_out():
    e, seconds = run_gate(Host([START_PRE, EXIT_1]), timeout=600)
    assert seconds < 2 and str(e).startswith("rigup-llama@gemma.service: llama-server exited with status 1 2.5 s after start, while loading\n")


def test_a_failed_start_up_command_keeps_the_health_wording():
    e, _ = run_gate(Host([START_PRE, PRE_FAILED], exits=JOURNAL_PRE, journal="rigup: RPC worker 10.0.0.2:50052 does not answer\n"))
    assert str(e) == ("rigup-llama@gemma.service: /health did not answer 200 (the unit failed: a start-up command exited with "
                      "status 1 (FAILURE))\nrigup: RPC worker 10.0.0.2:50052 does not answer\n")


def test_the_previous_starts_state_is_not_judged_while_rigups_start_is_queued():
    text, _ = run_gate(Host([QUEUED_OLD_FAILURE, START_PRE, LOADING, SERVING], completion=ANSWER))
    assert text == "Paris"


def test_a_probe_that_times_out_is_one_failed_poll():
    host = Host([TimeoutError, START_PRE, TimeoutError, SERVING], completion=ANSWER)
    text, _ = run_gate(host, record="/var/lib/rigup/gate/x.json")
    assert text == "Paris" and host.scripts("install -d")   # the tok/s recorded
    assert all(t is not None for _, t in host.calls)   # every command (Host checks its host-side timeout too)
    assert max(t for s, t in host.calls if s.startswith("systemctl show")) <= g.PROBE_TIMEOUT + 5
    assert [t for s, t in host.calls if "chat/completions" in s] == [20 + g.COMPLETION_MARGIN + 5]


def test_the_deadline_holds_when_probes_time_out():
    e, seconds = run_gate(Host([TimeoutError]), timeout=1)
    assert seconds < 3 and str(e).startswith("rigup-llama@gemma.service: /health did not answer 200 within 1 s (timeout); "
                                             "last journal lines:\n")


def test_a_server_that_never_answers_times_out_as_before():
    e, _ = run_gate(Host([LOADING]), timeout=1)
    assert str(e).startswith("rigup-llama@gemma.service: /health did not answer 200 within 1 s (timeout); last journal lines:\n")


def test_a_failed_completion_of_a_running_server():
    e, _ = run_gate(Host([SERVING], completion='{"error": "bad model"}'))
    assert str(e).startswith("rigup-llama@gemma.service: the health completion failed: '{\"error\": \"bad model\"}'; "
                             "last journal lines:\n")


def test_the_cpu_fallback_is_found_in_the_whole_start_and_named():
    host = Host([SERVING], completion=ANSWER, found="warning: no usable GPU found, --gpu-layers option will be ignored\n")
    e, _ = run_gate(host, fail_on_log="no usable GPU found")
    print(f"\n{str(e).splitlines()[0]}")
    assert str(e).startswith("rigup-llama@gemma.service: llama-server fell back to the CPU: its log says "
                             "'no usable GPU found'; last journal lines:\n")
    search = host.scripts("grep -F -m1")[0]
    assert f"_SYSTEMD_INVOCATION_ID={INV} -o cat --no-pager;" in search and "-n 60" not in search
    assert run_gate(Host([SERVING], completion=ANSWER), fail_on_log="no usable GPU found")[0] == "Paris"


def test_answered_logs_the_journal_first_and_the_reason_last():
    logged = []
    host = Host([START_PRE, SEGV], journal="a\nb\n")
    host.log_styled = lambda text, **kw: logged.append(text)
    trap = ("picked", "a known crash", "pin the build")
    assert g.answered(None, host, UNIT, 8081, "gemma", "Hi", 20, poll=0.01, traps=[trap]) is False
    assert logged == ["a\nb\n", "rigup-llama@gemma.service: llama-server crashed (SIGSEGV, core dumped) 0.6 s after "
                                "start, while loading; known trap that may match: picked: a known crash; fix: pin the build"]


def test_server_of():
    assert g.server_of(UNIT) == "llama-server" and g.server_of("rigup-vllm@qwen.service") == "vllm"
    assert g.server_of("rigup-gatefault-crash.service") == "rigup-gatefault-crash"


def test_a_signal_in_other_digits_is_no_number():
    """gate._signal: str.isdigit() took "²", which int() refused with a ValueError; "11" is SEGV."""
    from rigup.gate import _signal
    got = [_signal(t) for t in ("11", "segv", "\u00b2", "\u0661\u0661")]
    print(f"\n{got}")
    assert got == ["SIGSEGV", "SIGSEGV", "SIG\u00b2", "SIG\u0661\u0661"]


def test_systemds_counts_are_ascii_whole_numbers():
    """issue 61 (class 3): _int read systemctl show's NRestarts with int(), which took '١' (1) and '1_0'
    (10): a restart nobody made ended the gate; each is no count now (0), as an empty value."""
    assert [g._int(v) for v in ("3", " 3 ", "\u0661", "1_0", "\u00b2", "-1", "", None, "12345678901234567")] == \
        [3, 3, 0, 0, 0, 0, 0, 0, 12345678901234567]
    first = {"ActiveState": "active", "NRestarts": "0"}
    assert not g.ended({"ActiveState": "active", "SubState": "running", "NRestarts": "\u0661"}, first)
    assert g.ended({"ActiveState": "active", "SubState": "running", "NRestarts": "1"}, first)
