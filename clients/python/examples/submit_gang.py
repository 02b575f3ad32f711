#!/usr/bin/env python3
"""Submit a gang of 4 tasks (1 GPU each, preemption class 5, checkpoint auto)
and print its events until the allocation ends.

    export MUSTER_SCHEDULER=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
    export MUSTER_TLS_DIR=/path/to/tls      # or pass --insecure
    python examples/submit_gang.py

Exits 0 when the allocation is done, 1 when it failed or was cancelled,
2 when the cluster could not be asked.
"""

from __future__ import annotations

import argparse
import sys

from muster_client import Client, MusterError, allocation_status_name

COMMAND = "echo task $MUSTER_TASK_INDEX of $MUSTER_GANG_SIZE on GPUs $CUDA_VISIBLE_DEVICES; sleep 2"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheduler", help="host:port[,host:port...] (default: $MUSTER_SCHEDULER)")
    parser.add_argument("--tls-dir", help="TLS dir (default: $MUSTER_TLS_DIR)")
    parser.add_argument("--identity", help="certificate to present, e.g. admin-dev (default: the only admin one)")
    parser.add_argument("--insecure", action="store_true", help="plaintext, for a cluster run with --insecure")
    parser.add_argument("--command", default=COMMAND, help="shell command each task runs")
    args = parser.parse_args(argv)
    try:
        with Client(args.scheduler, tls_dir=args.tls_dir, identity=args.identity, insecure=args.insecure) as client:
            result = client.submit(
                ["sh", "-c", args.command],
                gang_size=4,
                gpus=1,
                preemption_class=5,
                checkpoint="auto",
                walltime_s=600,
            )
            print(f"allocation {result.id} submitted", flush=True)
            last = ""
            for event in client.watch(result.id):
                print(
                    f"{event.revision:>5}  {allocation_status_name(event.status):<12}  {event.kind:<20}  {event.detail}",
                    flush=True,
                )
                last = event.kind
    except (MusterError, ValueError) as e:
        print(f"submit_gang: {e}", file=sys.stderr)
        return 2
    return 0 if last == "allocation_done" else 1


if __name__ == "__main__":
    sys.exit(main())
