"""GRPO-style sampling: bring one sandbox to a state, fork it into 8 copies, let each sample
act on its own copy, and score the group. Run with SANDGATE_URL set."""

import os

from sandgate import Client

GROUP = 8

with Client() as gateway:
    root = gateway.create(image=os.environ.get("SANDGATE_IMAGE"), ttl_s=300)
    try:
        root.write_file("task/input.txt", "3 4\n")                  # the shared prompt state
        forks = root.fork(count=GROUP)                                # 8 copies of its files
        try:
            scores = []
            for i, sb in enumerate(forks):                            # sample i's "completion"
                sb.exec(f"read a b < task/input.txt; echo $((a * b + {i % 3})) > task/answer")
                answer = sb.read_file("task/answer").decode().strip()
                scores.append(1.0 if answer == "12" else 0.0)
            mean = sum(scores) / GROUP
            advantages = [s - mean for s in scores]                   # group-relative advantage
            assert root.read_file("task/input.txt") == b"3 4\n" and not root.exec("test -e task/answer").return_code == 0
            print(f"scores {scores} advantages {[round(a, 3) for a in advantages]}; done")
        finally:
            for sb in forks:
                sb.delete()
    finally:
        root.delete()
