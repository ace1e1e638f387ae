"""A host helper's malformed argument is a usage error with exit 2, never a traceback (round 3 of
issue 61, D4: ``rigup-balancer-drain reload x`` ended in a ValueError; rigup-burnin's H5 is in
tests/unit/test_burnin_records_file.py)."""

import subprocess
import sys

import pytest

from roles.balancer.shipped import drain


@pytest.mark.parametrize("argv", [["reload", "x"], ["reload", "٣"], ["reload", "²"], ["reload", "0"], ["reload", "1"],
                                  ["reload", "-5"], ["reload", "99999999999"], ["ready", "b", "s", "x"],
                                  ["ready", "b", "s", "0"], ["ready", "b", "s", "70000"], ["ready", "b", "s", "٨٠"]])
def test_a_malformed_number_is_the_usage(argv, capsys):
    assert drain.main(argv) == 2
    assert "rigup-balancer-drain" in capsys.readouterr().err


def test_the_program_itself_says_the_usage_and_exits_2():
    done = subprocess.run([sys.executable, drain.__file__, "reload", "x"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "reload MAINPID" in done.stderr
