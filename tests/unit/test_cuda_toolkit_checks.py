"""roles/cuda_toolkit/checks.py: the driver for the chosen CUDA, the CUDA for the cards (no hosts)."""

from rigup.gpu.catalogue import min_driver_for_cuda
from rigup.gpu.catalogue import newest_cuda_for_driver
from tests.unit.hosts import host, data, only, refusals


def test_4_driver_older_than_the_toolkit_needs():
    plan, facts = host("a100")  # driver 580.105.08
    (r,) = only(refusals(plan, facts, data(cuda_version="13.1")), "driver_for_cuda")
    assert r.what == "NVIDIA driver 580.105.08 is too old for CUDA 13.1"
    assert "needs driver >= 590.44.01" in r.why
    assert "set cuda_version to 13.0 or older" in r.fix and "upgrade the NVIDIA driver to >= 590.44.01" in r.fix


def test_4_unlisted_newer_version_uses_the_nearest_lower_minimum():
    plan, facts = host("h100", driver="575.57.08")
    (r,) = only(refusals(plan, facts, data(cuda_version="13.4")), "driver_for_cuda")
    assert "the minimum of CUDA 13.2, the nearest listed" in r.why


def test_4_cuda_version_that_is_not_major_minor():
    plan, facts = host("a100")
    (r,) = only(refusals(plan, facts, data(cuda_version="twelve")), "driver_for_cuda")
    assert "is not a CUDA version" in r.what


def test_4_driver_table_matches_the_release_notes():
    assert min_driver_for_cuda("11.8") == ("11.8", "520.61.05")
    assert min_driver_for_cuda("12.0") == ("12.0", "525.60.13")
    assert min_driver_for_cuda("12.4") == ("12.4", "550.54.14")
    assert min_driver_for_cuda("12.8") == ("12.8", "570.26")
    assert min_driver_for_cuda("13.0") == ("13.0", "580.65.06")
    assert min_driver_for_cuda("12.7") == ("12.6", "560.28.03")     # not a release: nearest lower
    assert min_driver_for_cuda("10.2") is None
    assert newest_cuda_for_driver("580.105.08") == "13.0"
    assert newest_cuda_for_driver("610.43.02") == "13.2"


def test_5_toolkit_too_old_for_hopper():
    plan, facts = host("h100")
    found = refusals(plan, facts, data(cuda_version="11.4"))
    (r,) = only(found, "cuda_for_archs")
    assert r.what == "CUDA 11.4 is too old for this host's cards"
    assert "h100 cards (sm_90) need CUDA >= 11.8" in r.why
    assert "set cuda_version to 11.8 or newer" in r.fix


def test_5_the_same_toolkit_is_fine_for_ampere():
    plan, facts = host("a100")
    assert refusals(plan, facts, data(cuda_version="11.4")) == []


def test_a_cuda_version_holding_a_shell_character_is_refused_by_its_form():
    """Round 5's note (H7): cuda_version was a free [str] written unquoted into the toolkit's login
    profile (export PATH=/usr/local/cuda-VERSION/bin:$PATH); only preflight's check stood before it."""
    from rigup.config import declared
    form = declared()["cuda_version"].form
    for bad in ("12.8;touch /tmp/x;", "12.8 $(id)", "12.8`id`", "../12.8", "12.8\n"):
        print(f"cuda_version {bad!r}: {form.problem(bad)}")
        assert form.problem(bad), bad
    assert form.problem("12.8") is None and form.problem("13.0") is None
