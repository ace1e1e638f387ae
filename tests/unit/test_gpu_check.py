"""tests/gpu runs on a GPU machine that has no pyinfra: every entry point and each subcommand's
code up to the GPU runs here with pyinfra made unimportable (and the lab's nvidia-smi stand-in on
PATH, an 8x A100 profile), so that an import of a pyinfra-only module from a pure one, or a role
function a script calls, cannot break a device run unseen (issue 45: `check.py smoke` once
failed at once on the H200 with "cannot import name 'host' from 'pyinfra'")."""

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "tests" / "lab" / "nvidia_smi.py"

# Each runs in a fresh python3 with pyinfra blocked, from the repository root, the scripts' folder
# on sys.path as when they run (`python3 tests/gpu/X.py`); WORK is an empty folder.
PRELUDE = """
import json, os, runpy, sys
from pathlib import Path
sys.modules['pyinfra'] = None
sys.path.insert(0, 'tests/gpu')
sys.argv = ['gpu-script']
WORK = Path(os.environ['WORK'])
"""

# every subcommand of check.py (its main's choices) and every other entry point: the code each
# runs before it needs a GPU, a build or a model, with the role functions it calls
STEPS = {
    "check.py plan": "sys.argv = ['check.py', 'plan', '--work', str(WORK)]\n"
                     "runpy.run_path('tests/gpu/check.py', run_name='__main__')",
    "check.py build": """
import check
facts, plan = check.facts_and_plan()
assert len(plan['cards']) == 8, plan
(WORK / 'llama.cpp.tar.gz').write_bytes(b'')   # build_id digests the archive
data = check.build_data(WORK / 'llama.cpp.tar.gz', WORK)
options = check.cmake_options(plan, data)
script = check.render_build_script(data, options, str(WORK / 'llama.cpp.tar.gz'))
print('build', check.build_id(data, options), 'CMAKE_CUDA_ARCHITECTURES=80' in ' '.join(options), len(script))
""",
    "check.py smoke, slower": """
import check, argparse
import tarfile
base = WORK / 'base'
(base / 'llama.cpp/src').mkdir(parents=True)
from tests.lab import sources
(base / 'llama.cpp' / sources.CRASH_FILE).write_text('// x\\n' + sources.DECODE + '    return 0;\\n}\\n')
with tarfile.open(WORK / 'base.tgz', 'w:gz') as tar:
    tar.add(base / 'llama.cpp', arcname='llama.cpp')
with tarfile.open(check.slow_archive(WORK / 'base.tgz', WORK / 'slow')) as tar:
    text = tar.extractfile('llama.cpp/' + sources.CRASH_FILE).read().decode()
assert sources.SLOW in text and text.startswith('#include <chrono>'), text
assert float(check.role_defaults('llama_cpp')['llama_cpp_slower_tolerance']) > 0
facts = check.parse_hardware(check.sh(check.hardware_command([str(WORK)])).splitlines())
print('remedies', check.smoke_remedies(facts['cpu']), check.cpu_line(facts['cpu'])[:20])
for ngl in (99, 0):
    flags = check.role_flags(ngl)
    assert ['-ngl', str(ngl)] == flags[flags.index('-ngl'):flags.index('-ngl') + 2], flags
    print('smoke', ' '.join(check.smoke.server_args(flags)))
assert check.SMOKE_SCRIPT.exists() and check.SMOKE_TINY.exists()
""",
    "check.py serve, bench": """
import check
argv = check.role_argv(WORK / 'bin', WORK / check.MODEL_FILE, {'id': 'b1'})
assert argv[0] == str(WORK / 'bin' / 'llama-server') and '--parallel' in argv, argv
print('serve', ' '.join(argv[1:]))
from shipped import throughput
""",
    "check.py tune, compare, admission": """
import check
from plays.shipped import tune
facts, plan = check.facts_and_plan()
inst, why = check.plan_instance(plan, check.SMOKE_TINY)
argv = check.inst_argv(WORK / 'bin', check.SMOKE_TINY, {'id': 'b1'}, inst)
print('tune', why, ' '.join(tune.with_flags(argv, {'port': check.TUNE_PORT, 'cache_ram': 0}, check.TUNE_FLAGS)[1:]))
print('goals', check.compare_goals(json.loads(Path('tests/gpu/results/2026-12-02-h200-tune.json').read_text())))
""",
    "check.py health, report": """
import check
from shipped import xid
from rigup.gpu.catalogue import xid_codes
from rigup.gpu.plan import link_state
print('health', link_state(4, 4, 16, 16), len(xid_codes()))
assert check.cmd_report and check.markdown and check._guard().QUERY
""",
    "check.py router, pinned": """
import check
argv = check.router_argv(WORK / 'bin', WORK / check.MODEL_FILE, {'id': 'b1'}, WORK / 'router.models.ini')
assert argv[argv.index('--models-preset') + 1] == str(WORK / 'router.models.ini') and '--models-max' in argv, argv
preset = (WORK / 'router.models.ini').read_text()
assert '[bench]' in preset and '[bench-b]' in preset and 'load-on-startup = true' in preset, preset
print('router', ' '.join(argv[1:]))
router, pinned, port = check.pinned_argvs(WORK / 'bin', WORK / check.MODEL_FILE, {'id': 'b1'}, WORK / 'pinned.ini')
preset = (WORK / 'pinned.ini').read_text()
assert '[bench-p]' not in preset and '[bench-b]' in preset and '[bench-c]' in preset, preset
assert port == check.ROUTER_PORT + 2 and pinned[pinned.index('--port') + 1] == str(port) and '--alias' in pinned, pinned
assert '--models-max' in router and '--models-preset' not in pinned, (router, pinned)
print('pinned', ' '.join(pinned[1:]))
""",
    "check.py model": """
import check
assert check.SHAPE['n_layer'] == 32 and check.gguf_source
""",
    "replicas.py": """
import replicas, check
facts, plan = check.facts_and_plan()
data = {**check.role_defaults('llama_cpp'), 'llama_cpp_backend': 'cuda', 'gpu_enabled': True, 'cmpunlocker_enabled': False}
model = {'repo': 'rigup-gpu/llama-8b-shape', 'size_gib': 15.0, 'family': None}
inst = {**check.RECIPE, 'replicas': 'auto', 'gpus_per_replica': 'auto'}
lay = replicas.replicas.layout(inst, model, plan, data)
servers = replicas.command.replica_commands('bench', inst, lay, '/bin/llama-server', '/m.gguf')
print('replicas', replicas.replicas.layout_text('bench', lay), len(servers))
print('balancer', len(replicas.balancer_config(8181, [8182, 8183])))
""",
    "rpc.py": """
import rpc, check
print('rpc', rpc.worker.argv('/b', '127.0.0.1', rpc.RPC_PORT), rpc.command.argv('bench', check.RECIPE, 's', 'm', rpc=['127.0.0.1:50052'])[-2:])
""",
    "power_plan.py": "sys.argv = ['power_plan.py', '--watts', '300']\n"
                     "runpy.run_path('tests/gpu/power_plan.py', run_name='__main__')",
    "driver_plan.py": "import driver_plan\nprint('driver_plan', driver_plan.summary)",
}


def run_step(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``code`` after the prelude, with the lab's nvidia-smi (an 8x A100 profile) on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {SIM} \"$@\"\n")
    smi.chmod(0o755)
    profile = json.loads((ROOT / "tests/lab/gpu_profiles.json").read_text())["a100"]
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin", WORK=str(work), PYTHONDONTWRITEBYTECODE="1",
               RIGUP_GPU_SIM_PROFILE=str(tmp_path / "profile.json"), RIGUP_GPU_SIM_RUN=str(tmp_path / "run"),
               RIGUP_GPU_SIM_LIB=str(tmp_path / "lib"))
    return subprocess.run([sys.executable, "-c", PRELUDE + code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_every_subcommand_of_check_py_is_covered():
    source = (ROOT / "tests/gpu/check.py").read_text()
    choices = source.split('parser.add_argument("step", choices=(', 1)[1].split(")", 1)[0]
    steps = {s.strip().strip('"') for s in choices.replace("\n", " ").split(",") if s.strip()}
    covered = {part.strip() for name in STEPS if name.startswith("check.py ")
               for part in name[len("check.py "):].split(",")}
    assert steps <= covered, f"check.py steps without a test here: {sorted(steps - covered)}"
    scripts = {p.name for p in (ROOT / "tests/gpu").glob("*.py")} - {"standalone.py"}
    assert scripts <= {name.split()[0] for name in STEPS}, scripts


@pytest.mark.parametrize("step", sorted(STEPS))
def test_gpu_script_runs_without_pyinfra(step, tmp_path):
    result = run_step(STEPS[step], tmp_path)
    print(result.stdout[-1500:])
    assert result.returncode == 0, f"{step}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


def test_check_py_plans_without_pyinfra(tmp_path):
    result = run_step(STEPS["check.py plan"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "cards:" in result.stdout and "cmake -DCMAKE_BUILD_TYPE=Release" in result.stdout
    assert "ExecStart=" in result.stdout and "--parallel 8" in result.stdout


def test_a_role_package_init_is_never_run_there(tmp_path):
    """The mend of `check.py smoke`: schema.py imports its sibling rigup.instances.tuned; loaded
    through tests/gpu/standalone.py the role's package is a bare folder, never its pyinfra deploy."""
    code = STEPS["check.py smoke, slower"] + "\nassert not hasattr(sys.modules['roles.llama_server'], 'apply')\n"
    result = run_step(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_compare_goals_are_judged_by_each_servers_label():
    check = runpy.run_path(str(ROOT / "tests/gpu/check.py"), run_name="check")
    doc = json.loads((ROOT / "tests/gpu/results/2026-12-02-h200-tune-morning.json").read_text())
    goals = check["compare_goals"](doc)
    assert goals["tuned >= 1.5x the reports' recipe at 16"] == (1.53, True)
    assert goals["tuned >= 2.5x the reports' recipe at 32"] == (2.12, False)
    assert goals["rigup's defaults >= 0.8x tuned at 16"] == (0.93, True)
    # the afternoon's run, with the prompt cache off in rigup's sized defaults: every goal met
    goals = check["compare_goals"](json.loads((ROOT / "tests/gpu/results/2026-12-02-h200-tune.json").read_text()))
    assert goals["tuned >= 2.5x the reports' recipe at 32"] == (3.37, True)
    assert goals["rigup's defaults >= 0.8x tuned at 16"] == (0.94, True) and all(met for _, met in goals.values())
