"""roles/burnin/fleetwide.py: a card's GEMM digest against its siblings' on the other hosts, from the
controller's copies of their records (issue 62); and roles/burnin judged(), which quarantines it."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from roles.burnin import fleetwide, judged
from roles.burnin.quarantine import lines, sort_cards

GOOD, BAD = "a" * 64, "b" * 64


def rec(digest=GOOD, passed=True, name="NVIDIA A100-SXM4-80GB", driver="580.105.08", cublas="12.4.5", **more):
    return {"passed": passed, "failed": [] if passed else ["x"], "index": 0, "bus_id": "00000000:07:00.0",
            "name": name, "level": "quick", "at": 1.0, "figures": {"vram": {"mib": 1}},
            "key": {"driver": driver, "memory_mib": 81920, "power_limit_w": 400.0}, "schema": 2,
            "gemm": {"load": "cublas", "dtype": "fp16", "cublas": cublas, "sms": 108, "digest": digest, "seeds": 3},
            **more}


def test_a_card_whose_digest_differs_from_its_siblings_on_other_hosts_is_named_with_both_digests():
    others = {"lab1": {"GPU-1": rec(), "GPU-2": rec()}, "lab2": {"GPU-3": rec(), "GPU-4": rec(BAD, passed=False)}}
    odd = fleetwide.odd_cards({"GPU-9": rec(BAD), "GPU-8": rec()}, others)
    print(odd)
    assert odd == {"GPU-9": f"GEMM: digest {BAD[:16]} differs from {GOOD[:16]}, what 2 of the 2 hosts with this key "
                            "(lab1, lab2: same product, driver and cuBLAS; one vote a host, this one's included) "
                            "computed from the same seeded operands: wrong results"}
    # another key compares with nothing: another cuBLAS, driver, product, load; no strict majority: no verdict
    for other in (rec(BAD, cublas="12.8.1"), rec(BAD, driver="570.1"), rec(BAD, name="NVIDIA H100 80GB HBM3"),
                  {**rec(BAD), "gemm": {**rec()["gemm"], "load": "ptx", "digest": BAD}}):
        assert fleetwide.odd_cards({"GPU-9": other}, others) == {}
    tie = {"lab1": {"GPU-1": rec()}, "lab2": {"GPU-2": rec("c" * 64)}}
    assert fleetwide.odd_cards({"GPU-9": rec(BAD)}, tie) == {}
    assert fleetwide.odd_cards({"GPU-9": rec(BAD, passed=False)}, others) == {}   # failed already: nothing to add
    assert fleetwide.odd_cards({"GPU-9": rec(BAD, cleared={"at": 1.0})}, others) == {}


def test_judged_quarantines_it_in_the_plan_and_keeps_the_hosts_own_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGUP_CACHE_DIR", str(tmp_path))
    (tmp_path / "burnin").mkdir(mode=0o700)
    for host in ("lab1", "lab2"):
        (tmp_path / "burnin" / f"{host}.json").write_text(json.dumps({f"GPU-{host}": rec()}))
    (tmp_path / "burnin" / "lab3.json").write_text("{nope")     # another host's copy that does not read: left out
    own = {"GPU-9": rec(BAD), "GPU-8": rec()}
    state, problems = judged("lab4", {"records": own}, "/var/lib/rigup/burnin.json", {"burnin_clear": []})
    assert problems == [] and state["records"]["GPU-9"]["passed"] is False and state["records"]["GPU-8"]["passed"]
    assert json.loads((tmp_path / "burnin" / "lab4.json").read_text())["GPU-9"]["passed"] is True   # as the host wrote it
    gpus = [{"index": i, "uuid": u, "bus_id": f"00000000:0{i}:00.0", "memory_total_mib": 81920, "power_limit_w": 400.0}
            for i, u in enumerate(("GPU-8", "GPU-9"))]
    part = sort_cards(gpus, state, "580.105.08", {"burnin_level": "standard", "burnin_after_change": "quick"})
    print("\n".join(lines(part)))
    assert [q["uuid"] for q in part["quarantined"]] == ["GPU-9"] and f"digest {BAD[:16]} differs from {GOOD[:16]}" \
        in part["quarantined"][0]["failed"][-1]
    cleared, _ = judged("lab4", {"records": own}, "/var/lib/rigup/burnin.json", {"burnin_clear": ["GPU-9"]})
    assert cleared["records"]["GPU-9"]["passed"] is True
    # round 6 BA20: only the inventory's hosts vote; copies left by hosts gone from it do not
    gone, _ = judged("lab4", {"records": own}, "/var/lib/rigup/burnin.json", {"burnin_clear": []}, ["lab4", "lab5"])
    assert gone["records"]["GPU-9"]["passed"] is True
    assert set(fleetwide.other_copies(tmp_path / "burnin" / "lab4.json", ["lab1", "lab4"])) == {"lab1"}


def test_one_vote_a_host_twelve_made_up_cards_on_one_host_do_not_outvote_two_honest_hosts():
    """Round 3, item 7: one copy listing 12 made-up passing cards with a wrong digest outvoted 4 honest
    cards on 2 hosts (a vote per record) and quarantined a good card."""
    evil = {f"GPU-{i:x}": rec(BAD) for i in range(1, 13)}
    others = {"evil": evil, "lab1": {"GPU-101": rec(), "GPU-102": rec()}, "lab2": {"GPU-201": rec(), "GPU-202": rec()}}
    odd = fleetwide.odd_cards({"GPU-900": rec()}, others)
    print("good card, 12 bad records on one host against 2 honest hosts:", odd)
    assert odd == {}
    # the same host alone against this one: one vote each, no strict majority
    alone = fleetwide.odd_cards({"GPU-900": rec()}, {"evil": evil})
    print("against one other host only:", alone)
    assert alone == {}
    # two honest hosts still outvote one wrong card here (2 of 3 hosts); with the made-up host, 2 of 4: a tie
    honest = {k: v for k, v in others.items() if k != "evil"}
    assert set(fleetwide.odd_cards({"GPU-900": rec(BAD)}, honest)) == {"GPU-900"}
    assert fleetwide.odd_cards({"GPU-900": rec(BAD)}, others) == {}


def test_a_copy_that_claims_this_hosts_card_does_not_vote_and_a_uuid_on_two_copies_is_left_out():
    """Round 3, item 8: another host's copy listed this host's own card UUID with a wrong digest and
    its votes counted against it."""
    others = {"evil": {"GPU-900": rec(BAD), "GPU-901": rec(BAD)}, "lab1": {"GPU-101": rec(BAD)}}
    odd = fleetwide.odd_cards({"GPU-900": rec()}, others)
    print("this host's UUID in another copy:", odd)
    assert odd == {}
    # a UUID two other copies both list votes on neither: lab1's and lab2's honest card stays theirs
    # (lab1, lab2 GOOD) while evil's copy of GPU-101/GPU-201 is dropped with them
    twice = {"evil": {"GPU-101": rec(BAD), "GPU-201": rec(BAD), "GPU-7": rec(BAD)},
             "lab1": {"GPU-101": rec(), "GPU-102": rec()}, "lab2": {"GPU-201": rec(), "GPU-202": rec()}}
    both = fleetwide.odd_cards({"GPU-900": rec()}, twice)
    print("UUIDs on two copies:", both)
    assert both == {}
    only_twice = {"a": {"GPU-5": rec(BAD)}, "b": {"GPU-5": rec(BAD)}}
    assert fleetwide.odd_cards({"GPU-900": rec()}, only_twice) == {}


values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                      lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=8)


@settings(max_examples=60, deadline=1000)
@given(gemm=st.dictionaries(st.sampled_from(["digest", "sms", "cublas", "dtype", "load", "seeds"]), values),
       name=values, key=values, passed=values)
def test_any_record_is_compared_or_left_alone(gemm, name, key, passed):
    """Records keep rigup-burnin's figures as written: any shape of gemm, name or key is compared or
    left out, never a crash (a dict in the key would be unhashable)."""
    odd = {**rec(), "gemm": gemm, "name": name, "key": key, "passed": passed}
    others = {"lab1": {"GPU-1": rec(), "GPU-2": odd}}
    assert set(fleetwide.odd_cards({"GPU-9": odd, "GPU-8": rec(BAD)}, others)) <= {"GPU-9", "GPU-8"}
