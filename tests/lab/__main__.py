"""Command line of the lab: `python -m tests.lab up|down|list|reboot|ssh` (as root)."""
import argparse
import sys
import time

from . import lab


def main(argv=None):
    """Parse the command line, run the command, return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=lab.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="boot hosts lab1..labN (keeps running ones)")
    p_up.add_argument("-n", type=int, default=1, help="number of hosts (default 1)")
    p_up.add_argument("--profile", choices=lab.PROFILES, default="none", help="simulated GPU")
    p_up.add_argument("--first", type=int, default=1,
                      help="number of the first host (default 1): --first 3 -n 2 boots lab3, lab4")
    p_up.add_argument("--no-init", dest="init", action="store_false",
                      help="run sshd alone, without systemd, as a docker-style rental container does")
    p_up.add_argument("--no-driver", dest="driver", action="store_false",
                      help="the profile's cards on the PCI bus, no NVIDIA driver (roles/nvidia_driver installs it)")
    p_rm = sub.add_parser("remove", help="remove one host; the others keep running")
    p_rm.add_argument("name")
    sub.add_parser("down", help="remove every lab host, the bridge and the proxy")
    sub.add_parser("list", help="print the running hosts")
    p_reboot = sub.add_parser("reboot", help="reboot a host and wait until it is back")
    p_reboot.add_argument("name")
    p_ssh = sub.add_parser("ssh", help="run a command on a host: ssh NAME -- CMD...")
    p_ssh.add_argument("name")
    p_ssh.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        if args.command == "up":
            lab.up(args.n, args.profile, args.first, args.init, driver=args.driver)
        elif args.command == "remove":
            lab.remove(args.name)
        elif args.command == "down":
            lab.down()
        elif args.command == "list":
            for h in lab.hosts():
                print(f"{h['name']}\t{h['address']}\t{lab.kind(h['profile'], h.get('init', True), h.get('driver', True))}")
        elif args.command == "reboot":
            print(f"{args.name}: {lab.reboot(args.name)}")
        else:
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            return lab.ssh(args.name, " ".join(cmd), capture=False).returncode
    except lab.LabError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 1
    if args.command in ("up", "down", "reboot", "remove"):
        print(f"{args.command} took {time.monotonic() - start:.1f} s")
    return 0


sys.exit(main())
