"""Child process of the recorder kill tests: records episodes of known lengths slowly and
says on stdout what is durable, so the parent can SIGKILL it at a chosen moment.

argv: root, crash ("mid" = the parent kills it mid-episode; "save" = it kills itself inside
the third save, after LeRobot wrote the episode but before the dataset was finalised;
"batch" = like "mid", with commits every 3 episodes: it says "committed N" at each), and
optionally "cameras": two 32 x 32 video cameras whose frames encode (episode, step).
"""

import os
import signal
import sys
import time

import numpy as np

from arli.record import EpisodeRecorder, dataset_features

root, crash = sys.argv[1], sys.argv[2]
cameras = ["front", "wrist"] if sys.argv[3:] == ["cameras"] else []
features = dataset_features(["x", "y"], ["a"], 32 if cameras else 0, cameras, use_videos=True)
commit_every = 3 if crash == "batch" else 1
rec = EpisodeRecorder(root, 20, features, commit_every=commit_every)
if crash == "save":
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    original, calls = LeRobotDataset.finalize, {"n": 0}

    def finalize_then_die(self):
        calls["n"] += 1
        if calls["n"] == 3:  # inside the third save: data written, dataset not finalised
            os.kill(os.getpid(), signal.SIGKILL)
        original(self)

    LeRobotDataset.finalize = finalize_then_die
for ep in range(10):
    n = 15 + 3 * ep
    for t in range(n):
        images = {c: np.full((32, 32, 3), 10 * ep + 100 * i, np.uint8) for i, c in enumerate(cameras)}
        rec.add_frame(np.array([ep, t], np.float32), np.array([t / n], np.float32), 0.0, t == n - 1,
                      False, "count", images)
        if t == n // 2 and ep >= 2:
            print(f"mid {ep}", flush=True)
            time.sleep(0.3)
    rec.save_episode()
    print(f"saved {ep} {n}", flush=True)
    if (ep + 1) % commit_every == 0:
        print(f"committed {ep + 1}", flush=True)
