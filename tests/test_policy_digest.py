"""``policy_digest``: what a sweep keys a base policy's cells on."""

from arli.policies.load import EXPERT, policy_digest


def _ckpt(root, files: dict[str, bytes]):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(root)


def test_the_digest_follows_weights_and_configs_not_records_or_paths(tmp_path):
    files = {"config.json": b'{"type": "arli_flow"}', "model.safetensors": b"\x00\x01",
             "processor/step_0.json": b"{}"}
    a = policy_digest(_ckpt(tmp_path / "a", files))
    # another path, files written in another order, different wall times in the summaries
    b = policy_digest(_ckpt(tmp_path / "b", {**dict(reversed(list(files.items()))),
                                            "pretrain_summary.json": b'{"train_time_s": 118.4}'}))
    assert a == b and len(a) == 12
    assert policy_digest(_ckpt(tmp_path / "w", {**files, "model.safetensors": b"\x00\x02"})) != a
    assert policy_digest(_ckpt(tmp_path / "p", {**files, "processor/step_0.json": b'{"mean": 1}'})) != a
    renamed = {("processor/step_1.json" if k == "processor/step_0.json" else k): v for k, v in files.items()}
    assert policy_digest(_ckpt(tmp_path / "r", renamed)) != a
    assert policy_digest(EXPERT) == EXPERT
