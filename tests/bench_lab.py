"""`make bench-lab`: how long the lab takes to boot, and a first and a second converge take.

Prints one table, measured in one run on this machine (the base root is built first if it is
not cached, and that time is printed apart). Tears the lab down at the end.
"""

import time

from tests.converge import converge
from tests.lab import hub, lab, models, sources


def timed(fn, *args):
    start = time.monotonic()
    fn(*args)
    return time.monotonic() - start


def main() -> None:
    rows = []
    lab.down()
    try:
        rows.append(("base root (cached after its first build)", timed(lambda: (lab.ensure_tools(), lab.build_base()))))
        rows.append(("lab-up, 1 host", timed(lab.up, 1, "a100")))
        lab.down()
        rows.append(("lab-up, 4 hosts", timed(lab.up, 4, "a100")))
        sources.llama_cpp_mirror()
        sources.serve()
        hub.serve()              # group_vars/lab.yml's model from the lab's hub, as the other benchmarks do
        models.publish_gemma()
        alone = converge("inventory/lab.py", "--limit", "lab1")
        rows.append(("first converge, lab1 alone (llama.cpp cold or from ccache)", alone.seconds))
        first = converge()
        rows.append(("first converge, the 3 others (shared ccache)", first.seconds))
        second = converge()
        rows.append((f"second converge, 4 hosts ({second.totals['changed']} changed ops)",
                     second.seconds))
        rows.append(("second converge, per host", second.seconds / 4))
    finally:
        rows.append(("lab-down, 4 hosts", timed(lab.down)))
    print("\n" + table(rows))


def table(rows: list[tuple[str, float]]) -> str:
    """The rows as a two-column text table of seconds."""
    width = max(len(r[0]) for r in rows)
    return "\n".join([f"{'what':<{width}}  seconds"] + [f"{what:<{width}}  {seconds:7.1f}" for what, seconds in rows])


if __name__ == "__main__":
    main()
