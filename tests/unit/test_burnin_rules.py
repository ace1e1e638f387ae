"""rigup-burnin's soak rules, pure (roles/burnin/shipped/acceptance.py): the mean draw in the soak's window
against the cap in force, the verdicts on watts and repeated digests, the comparison of sibling
cards (a digest other than the majority's, a slow card flagged or quarantined), the random
operands' values; arbitrary samples and records never raise."""

import math

from hypothesis import given, settings, strategies as st

from roles.burnin.shipped import acceptance

OPTS = {"pcie_min_ratio": 0.25, "throttle_max": 0.25, "power_min_ratio": 0.9, "slow_flag_ratio": 0.9,
        "slow_quarantine_ratio": 0.8}


def rows(draws, t0=100.0, step=0.5, cap=700.0, events=0x4):
    return [{"t": t0 + i * step, "power.draw": d, "enforced.power.limit": cap, "events": events} for i, d in enumerate(draws)]


def test_the_mean_draw_is_the_soaks_window_less_its_ramp():
    samples = rows([100.0] * 10 + [690.0] * 230 + [90.0] * 10, t0=95.0)   # idle, 115 s of load, idle after
    power = acceptance.power_of(samples, [100.0, 214.5], 650.0)
    # the window's first POWER_RAMP_S left out (5 s), the idle before and after outside it
    assert power == {"mean_w": 690.0, "cap_w": 700.0, "ratio": 0.986, "samples": 220, "capped_ratio": 1.0}
    short = acceptance.power_of(rows([300.0, 650.0, 650.0, 650.0]), [100.0, 102.0], 650.0)
    assert short["samples"] == 4 - 1 and short["mean_w"] == 650.0   # a 2 s window: its first 20% left out
    nocap = acceptance.power_of([{"t": 101.0, "power.draw": 350.0}] * 3, [100.0, 102.0], 700)
    assert nocap["cap_w"] == 700 and nocap["ratio"] == 0.5           # the card's power.limit where none was sampled
    assert acceptance.power_of(samples, None, 700.0) == {}
    assert acceptance.power_of([{"t": 101.0, "power.draw": None}], [100.0, 102.0], 700.0) == {"samples": 0, "cap_w": 700.0}


def test_watts_fail_a_card_under_cublas_only_and_a_repeat_that_differs_always():
    power = {"mean_w": 594.4, "cap_w": 700.0, "ratio": 0.849, "samples": 215, "judged": True}
    assert acceptance.judge({}, {"power": power}, OPTS) == [
        "soak: mean draw 594 W, 0.85 of the 700 W cap in force over 215 samples under GEMM load (at least 0.90 "
        "wanted): the card, its power delivery or its cooling does not hold full load"]
    assert acceptance.judge({}, {"power": {**power, "judged": False}}, OPTS) == []
    assert acceptance.judge({}, {"power": {**power, "ratio": 0.95}}, OPTS) == []
    gemm = {"differ": 2, "repeats": 113, "dtype": "fp16", "odd": "seed 1: 0123456789abcdef then fedcba9876543210"}
    assert acceptance.judge({}, {"gemm": gemm}, OPTS) == [
        "GEMM: 2 of 113 repeats of the same seeded fp16 GEMMs gave another result (seed 1: 0123456789abcdef then "
        "fedcba9876543210): the card computes wrong under load"]


def record(name="NVIDIA H100 80GB HBM3", digest="a" * 64, tflops=580.0, cap=700.0, watts=690.0, cublas="13.1.0"):
    return {"name": name, "passed": True, "failed": [], "flagged": [], "key": {"driver": "580.159.04"},
            "gemm": {"digest": digest, "tflops": tflops, "tflops_per_w": round(tflops / watts, 4), "sms": 132,
                     "cublas": cublas, "dtype": "fp16", "load": "cublas"},
            "power": {"cap_w": cap, "mean_w": watts}}


def test_the_odd_card_fails_naming_its_digest_and_a_tie_fails_every_card_of_it():
    recs = {f"GPU-{i}": record() for i in range(4)}
    recs["GPU-2"]["gemm"]["digest"] = "b" * 64
    acceptance.siblings(recs, OPTS)
    assert [r["passed"] for r in recs.values()] == [True, True, False, True]
    assert recs["GPU-2"]["failed"] == [f"GEMM: digest {'b' * 16} differs from {'a' * 16}, what 3 of its 3 siblings "
                                       "(same product, driver and cuBLAS) computed from the same seeded operands: wrong results"]
    pair = {"GPU-0": record(), "GPU-1": record(digest="c" * 64)}
    acceptance.siblings(pair, OPTS)
    assert not pair["GPU-0"]["passed"] and not pair["GPU-1"]["passed"]
    assert pair["GPU-0"]["failed"] == [f"GEMM: digest {'a' * 16} differs from its siblings' ({'c' * 16}) with no majority among 2 cards"]
    # another product, another cuBLAS: no siblings, nothing compared (a lone card is judged on its repeats)
    apart = {"GPU-0": record(), "GPU-1": record(name="NVIDIA H200", digest="d" * 64), "GPU-2": record(cublas="12.4.5", digest="e" * 64)}
    acceptance.siblings(apart, OPTS)
    assert all(r["passed"] and not r["flagged"] for r in apart.values())


def test_a_slow_card_is_flagged_below_090_and_quarantined_below_080_of_its_siblings_median():
    recs = {"GPU-0": record(), "GPU-1": record(tflops=570.0), "GPU-2": record(tflops=500.0), "GPU-3": record(tflops=440.0)}
    acceptance.siblings(recs, OPTS)
    assert recs["GPU-0"]["passed"] and recs["GPU-1"]["passed"] and not recs["GPU-1"]["flagged"]
    assert recs["GPU-2"]["passed"] and recs["GPU-2"]["flagged"] == [
        "GEMM: 500.0 TFLOPS, 0.88 of its siblings' median (below 0.90: watch it)"]
    assert not recs["GPU-3"]["passed"] and recs["GPU-3"]["failed"] == [
        "GEMM: 440.0 TFLOPS, 0.77 of its siblings' median (at least 0.80 wanted): a slow card"]
    # at another cap, TFLOPS per watt: 400 TFLOPS at 476 W is as efficient as 580 at 690 W
    other = {"GPU-0": record(), "GPU-1": record(), "GPU-2": record(tflops=400.0, cap=500.0, watts=400.0 * 690 / 580)}
    acceptance.siblings(other, OPTS)
    assert all(r["passed"] and not r["flagged"] for r in other.values())
    assert 0.99 < other["GPU-2"]["gemm"]["sibling_ratio"] < 1.01


def test_the_random_operands_are_murmur3s_finaliser_masked_into_half_to_one():
    assert acceptance.rand_word(1, 0, "fp32") == (0x514E28B7 & 0x807FFFFF) | 0x3F000000   # fmix32(1) = 0x514E28B7
    for operand, (lo, width) in {"fp16": (0.5, 16), "bf16": (0.5, 16), "fp32": (0.5, 32)}.items():
        for i in range(64):
            word = acceptance.rand_word(i, 7, operand)
            parts = [word & 0xFFFF, word >> 16] if width == 16 else [word]
            for bits in parts:
                value = decode(bits, operand)
                assert lo <= abs(value) < 1.0, (operand, hex(bits), value)
    assert len({acceptance.rand_word(i, 3) for i in range(1000)}) > 990   # random, not a constant


def decode(bits, operand):
    import struct
    if operand == "fp16":
        return struct.unpack("<e", struct.pack("<H", bits))[0]
    if operand == "bf16":
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    return struct.unpack("<f", struct.pack("<I", bits))[0]


ANY = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
                st.text(max_size=8), st.lists(st.integers(), max_size=2))


@settings(max_examples=60, deadline=1000)
@given(st.lists(st.dictionaries(st.sampled_from(["t", "power.draw", "enforced.power.limit", "events", "x"]), ANY), max_size=12),
       ANY, ANY)
def test_arbitrary_samples_give_a_bounded_figure_or_none(samples, window, cap):
    power = acceptance.power_of(samples, window if not isinstance(window, list) else [0.0, 10.0], cap)
    assert isinstance(power, dict)
    if power.get("ratio") is not None:
        assert isinstance(power["ratio"], float) and power["samples"] >= 1 and power["cap_w"] > 0


@settings(max_examples=60, deadline=1000)
@given(st.dictionaries(st.text(max_size=6), st.fixed_dictionaries(
    {"name": st.sampled_from(["A", "B"]), "passed": st.just(True), "failed": st.builds(list),
     "gemm": st.fixed_dictionaries({"digest": st.sampled_from(["x" * 64, "y" * 64, ""]), "sms": st.just(1),
                                    "tflops": st.one_of(st.none(), st.floats(0.1, 1e4)),
                                    "tflops_per_w": st.one_of(st.none(), st.floats(1e-3, 10))}),
     "power": st.fixed_dictionaries({"cap_w": st.sampled_from([None, 300.0, 700.0])})}), max_size=6))
def test_any_set_of_siblings_is_judged_without_an_error(records):
    acceptance.siblings(records, OPTS)
    for rec in records.values():
        assert rec["passed"] == (not rec["failed"])
        ratio = rec["gemm"].get("sibling_ratio")
        assert ratio is None or (math.isfinite(ratio) and ratio >= 0)
