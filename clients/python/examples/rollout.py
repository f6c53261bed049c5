"""A rollout loop: one sandbox per episode, a policy's actions run as commands, a reward read
back from the sandbox. Run with SANDGATE_URL (and SANDGATE_API_KEY, SANDGATE_IMAGE) set."""

import os

from sandgate import Client

ACTIONS = ["echo 2 > x", "echo $(( $(cat x) * 21 )) > x", "cat x"]  # a stand-in policy's actions

with Client() as gateway:
    rewards = []
    for episode in range(3):
        sb = gateway.create(image=os.environ.get("SANDGATE_IMAGE"), ttl_s=300, metadata={"episode": str(episode)})
        try:
            for action in ACTIONS:
                result = sb.exec(action, timeout_s=30)
                if result.return_code != 0:
                    break
            rewards.append(1.0 if result.stdout.strip() == "42" else 0.0)
        finally:
            sb.delete()
    print(f"rewards {rewards}; done")
