"""A stand-in pipe for testing the conformance runner without any DWN.

    python fake_pipe.py --store PATH [--code N] [--die-after N] [--hang-after N]
                        [--garbage-after N] [--entries N]

Answers every request line with ``status.code`` N (default 202), a ``cid`` derived from the
request's message (so two fake pipes agree with each other), and for ``query`` requests
``--entries`` made-up entries. The ``--*-after`` options make it misbehave after that many
replies: exit, stop answering, or write a line that is not JSON. The store path is echoed
in the reply detail so tests can see which store a pipe got.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--code", type=int, default=202)
    parser.add_argument("--die-after", type=int, default=-1)
    parser.add_argument("--hang-after", type=int, default=-1)
    parser.add_argument("--garbage-after", type=int, default=-1)
    parser.add_argument("--entries", type=int, default=0)
    args = parser.parse_args()
    answered = 0
    for line in sys.stdin:
        if answered == args.die_after:
            print("fake pipe: dying on purpose", file=sys.stderr, flush=True)
            return 3
        if answered == args.hang_after:
            time.sleep(3600)
        if answered == args.garbage_after:
            sys.stdout.write("this is not json\n")
            sys.stdout.flush()
            answered += 1
            continue
        try:
            request = json.loads(line)
        except ValueError:
            request = None
        message = request.get("message") if isinstance(request, dict) else None
        digest = hashlib.sha256(json.dumps(message, sort_keys=True).encode()).hexdigest()
        reply: dict[str, object] = {
            "cid": f"fake-{digest[:16]}" if message is not None else None,
            "status": {"code": args.code, "detail": f"store={args.store}"},
        }
        if isinstance(request, dict) and request.get("op") == "query":
            reply["entries"] = [{"recordId": f"r{i}", "cid": f"c{i}"} for i in range(args.entries)]
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
        answered += 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
