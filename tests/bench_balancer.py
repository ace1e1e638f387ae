"""`make bench-balancer`: what HAProxy (roles/balancer) costs at 8 concurrent chat completions,
measured in one run (the goal: at least 0.98x of the replicas' own throughput).

Boots lab1 (a100 profile), converges it with Gemma 3 270M as 2 replicas behind HAProxy with the
fleet key (tests/roles/test_balancer.py's recipe), then alternates rounds through HAProxy and
straight to the replicas (round robin), 8 requests x 16 tokens at 8 concurrent each, after one
pass of each not counted (the servers' first requests), the two in turn first, and judges the median
of the rounds' ratios: on 2 shared cores one round swings 10-20% (a run of 3 rounds judged by the
ratio of their sums read 0.951x, its first round 0.79x, the next two 1.06x and 1.01x). Prints both
rates, each round's ratio and the median; writes them under tests/bench/results/. Needs root; tears the lab
down unless --keep. make test keeps the mechanism (8 concurrent through HAProxy, all answered).

    .venv/bin/python -m tests.bench_balancer [--rounds 5] [--keep]
"""

import argparse
import datetime
import json
import statistics

from tests.converge import ROOT, converge
from tests.lab import hub, lab, models, sources
from tests.roles.test_balancer import DATA, KEY, KEY_SRC, LOAD

RESULTS = ROOT / "tests" / "bench" / "results"
HOST = "lab1"
URLS = {"haproxy": ["http://127.0.0.1:8081"], "direct": ["http://127.0.0.1:8082", "http://127.0.0.1:8083"]}


def rate(kind: str) -> float:
    """tok/s of one round of 8 x 16 tokens at 8 concurrent to ``kind``'s URLs; every request answered."""
    out = lab.ssh(HOST, f"python3 /root/load.py {','.join(URLS[kind])} 8 8 16 {KEY}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and result["failed"] == 0, (out.stderr, result)
    return result["tokens"] / result["seconds"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench_balancer", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    lab.down()
    try:
        lab.up(1, "a100")
        sources.llama_cpp_mirror()
        sources.serve()
        hub.serve()
        models.publish_gemma()
        KEY_SRC.unlink(missing_ok=True)
        converge("inventory/lab.py", *DATA)
        lab.ssh(HOST, f"cat > /root/load.py <<'EOF'\n{LOAD}\nEOF")
        for kind in URLS:   # the servers' first requests, not counted
            rate(kind)
        rates: dict[str, list[float]] = {"haproxy": [], "direct": []}
        ratios = []
        for i in range(args.rounds):
            for kind in (("haproxy", "direct") if i % 2 == 0 else ("direct", "haproxy")):
                rates[kind].append(round(rate(kind), 1))
            ratios.append(round(rates["haproxy"][-1] / rates["direct"][-1], 3))
            print(f"round {i + 1}: {', '.join(f'{k} {v[-1]} tok/s' for k, v in rates.items())}: {ratios[-1]}x",
                  flush=True)
        ratio = statistics.median(ratios)
        figures = {"date": datetime.date.today().isoformat(), "rounds": args.rounds, "rates_tok_s": rates,
                   "ratios": ratios, "ratio_haproxy_direct": round(ratio, 3), "judged_by": "median of the rounds",
                   "ratio_of_sums": round(sum(rates["haproxy"]) / sum(rates["direct"]), 3), "goal_at_least": 0.98}
        print(json.dumps(figures, indent=1))
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"{figures['date']}-balancer.json"
        out.write_text(json.dumps(figures, indent=1) + "\n")
        print(f"HAProxy / straight to the replicas at 8 concurrent: {ratio:.3f}x, the median of {args.rounds} rounds "
              f"(goal 0.98x); wrote {out}")
    finally:
        if not args.keep:
            lab.down()


if __name__ == "__main__":
    main()
