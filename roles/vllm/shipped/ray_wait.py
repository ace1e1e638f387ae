# rigup: runs on hosts (standard library only, and the other host programs: tests/unit/test_host_programs.py)
"""rigup-ray-wait: wait until a Ray cluster shows every expected node alive (roles/vllm/ray.py).

    python rigup-ray-wait GCS_ADDRESS SECONDS NODE_ADDRESS...

Run by the Ray venv's python (it imports ray), as an ExecStartPre: a worker waits for its head,
the head's vLLM instance for every node. It asks the GCS for its node table (Ray's GcsClient, no
driver started, nothing written); before ``SECONDS`` pass, exit 0 once every address is among the
alive nodes; else exit 1 naming the missing ones. Standard library and ray only (no tenacity in
that venv: the retry loop is written here).
"""

import itertools
import socket
import sys
import time


def shown(text: object, limit: int = 200) -> str:
    """Text from outside as it may reach a terminal or the journal: rigup.text.shown's copy (a host
    program has the standard library only; tests/unit/test_terminal.py holds the two equal)."""
    raw = str(text)
    pieces = [c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit]]
    kept = len(list(itertools.takewhile(limit.__ge__, itertools.accumulate(map(len, pieces)))))
    return "".join(pieces[:kept]) + (f"... ({len(raw) - kept} more characters)" if kept < len(raw) else "")


def alive_nodes(gcs: str) -> set[str]:
    """The addresses of the alive nodes of the cluster at ``gcs`` (ADDRESS:PORT)."""
    host, _, port = gcs.rpartition(":")
    socket.create_connection((host, int(port)), timeout=3).close()   # fails fast (the client waits 30 s)
    from ray._raylet import GcsClient   # Ray's own client of its GCS (the version is pinned: vllm_ray_version)

    infos = GcsClient(address=gcs).get_all_node_info(timeout=5)
    return {info.node_manager_address for info in infos.values() if info.state == 0}   # 0: ALIVE


def main(argv: list[str]) -> int:
    gcs, seconds, expected = argv[0], int(argv[1]), argv[2:]
    end, seen, why = time.monotonic() + seconds, set(), ""
    while True:
        try:
            seen, why = alive_nodes(gcs), ""
        except Exception as e:       # the GCS is not up yet: any error of the client is a retry
            why = f" ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        missing = [a for a in expected if a not in seen]
        if not missing:
            print(shown(f"rigup: Ray cluster {gcs} has every expected node: {', '.join(expected)}", 4000))
            return 0
        if time.monotonic() >= end:
            print(shown(f"rigup: Ray cluster {gcs} lacks node(s) {', '.join(missing)} after {seconds} s "
                        f"(alive: {', '.join(sorted(seen)) or 'none'}){why}; is rigup-ray running there?", 4000), file=sys.stderr)
            return 1
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
