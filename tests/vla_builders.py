"""Tiny VLA checkpoints (SmolVLA, pi0, pi0.5) built at random init from LeRobot's own classes
and saved with LeRobot's own save_pretrained and pre/post processors. Nothing is downloaded:
the VLM backbone config, its processor and the tokenizer are written locally.

Every checkpoint takes ``observation.state`` (N,), the cameras given (name -> (3, h, w)) as
``observation.images.<name>``, and emits (chunk_size, M) actions.
"""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import torch

# words the tiny tokenizers are trained on; any other text still tokenizes (byte-level BPE)
_CORPUS = ["pick up the red cube", "insert the peg into the hole", "push the block to the goal",
           "open the drawer", "stack the green block on the blue one", "put the cup in the sink"]
# SmolVLM's processor reads these from its tokenizer (``<name>`` and ``<name>_id``)
_SMOLVLM_SPECIAL = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                    "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}

def build_tokenizer(path: Path, special: dict[str, str] | None = None, vocab_size: int = 400):
    """A byte-level BPE tokenizer trained on a few instructions, saved at ``path`` as a
    PreTrainedTokenizerFast (AutoTokenizer loads it). special: extra named special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    special = special or {}
    base = ["<pad>", "<unk>", "<bos>", "<eos>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=base + list(special.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<bos>", eos_token="<eos>", extra_special_tokens=special)
    fast.save_pretrained(path)
    return fast


def build_smolvlm_backbone(path: Path, image_size: int = 32) -> Path:
    """A tiny SmolVLM (Idefics3 family) backbone directory for SmolVLA's ``vlm_model_name``:
    config.json (2 text layers of width 64, 1 vision layer of width 32, ``image_size`` square
    images in 8-px patches), its processor and tokenizer. No weights: SmolVLA builds it with
    ``load_vlm_weights=False``."""
    from transformers import (LlamaConfig, SmolVLMConfig, SmolVLMImageProcessor,  # noqa: PLC0415
                              SmolVLMProcessor, SmolVLMVideoProcessor)

    path = Path(path)
    tokenizer = build_tokenizer(path, _SMOLVLM_SPECIAL)
    pad = tokenizer.pad_token_id
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                       rms_norm_eps=1e-5, pad_token_id=pad, tie_word_embeddings=False)
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": image_size, "patch_size": 8}
    SmolVLMConfig(text_config=text.to_dict(), vision_config=vision, scale_factor=2, pad_token_id=pad,
                  image_token_id=tokenizer.convert_tokens_to_ids("<image>")).save_pretrained(path)
    size = {"longest_edge": image_size}
    SmolVLMProcessor(image_processor=SmolVLMImageProcessor(size=size, max_image_size=size),
                     tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(),
                     image_seq_len=(image_size // 8 // 2) ** 2).save_pretrained(path)
    return path


def _relative_paths(path: Path) -> None:
    """Every path into the checkpoint directory written in its config and pre-processor (the
    local backbone, the tokenizer) made relative to it, so the directory can be moved or copied
    (the adapter resolves such names against the checkpoint)."""
    prefix = str(path) + "/"

    def rel(value):
        if isinstance(value, str) and value.startswith(prefix):
            return value[len(prefix):]
        if isinstance(value, dict):
            return {k: rel(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rel(v) for v in value]
        return value

    for name in ("config.json", "policy_preprocessor.json"):
        file = path / name
        file.write_text(json.dumps(rel(json.loads(file.read_text())), indent=4))


def _stats(n: int) -> dict[str, torch.Tensor]:
    return {"mean": torch.zeros(n), "std": torch.ones(n), "min": -torch.ones(n), "max": torch.ones(n),
            "q01": -torch.ones(n), "q99": torch.ones(n)}


def _config(kind: str, N: int, M: int, cameras: dict[str, tuple[int, int, int]], **kw):
    from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: PLC0415
    from lerobot.policies.factory import make_policy_config  # noqa: PLC0415

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (N,))}
    inputs.update({f"observation.images.{name}": PolicyFeature(FeatureType.VISUAL, tuple(shape))
                   for name, shape in cameras.items()})
    return make_policy_config(kind, device="cpu", input_features=inputs,
                              output_features={"action": PolicyFeature(FeatureType.ACTION, (M,))}, **kw)


def _save(kind: str, cfg, path: Path, stats: dict, make_processors) -> None:
    from lerobot.policies.factory import get_policy_class  # noqa: PLC0415

    torch.manual_seed(0)
    policy = get_policy_class(kind)(cfg)
    pre, post = make_processors(cfg, dataset_stats=stats)
    policy.save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)


def save_smolvla(path: Path, N: int, M: int, cameras: dict[str, tuple[int, int, int]],
                 chunk_size: int = 8, n_action_steps: int | None = None, **kw) -> Path:
    """A random-init SmolVLA on a tiny local backbone (at ``path/vlm``), saved at ``path`` with
    the pre/post processors ``make_pre_post_processors`` builds for it (its tokenizer step
    points at the local backbone); both named relative to ``path``."""
    from lerobot.policies.factory import make_pre_post_processors  # noqa: PLC0415

    path = Path(path)
    vlm = build_smolvlm_backbone(path / "vlm")
    cfg = _config("smolvla", N, M, cameras, vlm_model_name=str(vlm), load_vlm_weights=False,
                  num_vlm_layers=2, self_attn_every_n_layers=2, expert_width_multiplier=0.75,
                  chunk_size=chunk_size, n_action_steps=n_action_steps or chunk_size, num_steps=2,
                  resize_imgs_with_padding=(32, 32), tokenizer_max_length=16, **kw)
    image_stats = {f"observation.images.{n}": {k: torch.full((3, 1, 1), v) for k, v in
                                               (("mean", 0.5), ("std", 0.25), ("min", 0.0), ("max", 1.0))}
                   for n in cameras}
    _save("smolvla", cfg, path, {"observation.state": _stats(N), "action": _stats(M), **image_stats},
          make_pre_post_processors)
    _relative_paths(path)
    return path


def save_pi(kind: str, path: Path, N: int, M: int, cameras: dict[str, tuple[int, int, int]],
            chunk_size: int = 8, **kw) -> Path:
    """A random-init pi0 (``kind="pi0"``) or pi0.5 (``"pi05"``) at the smallest size LeRobot
    can run (a ``gemma_2b`` PaliGemma backbone and a ``gemma_300m`` action expert: about 3.3 B
    parameters; LeRobot fixes the SigLIP projection at 2048 wide, so a ``gemma_300m`` backbone
    builds but fails at its first forward pass), saved at ``path`` with LeRobot's
    own pre/post processors; their tokenizer step points at a local tokenizer (``path/tokenizer``)
    instead of the gated google/paligemma-3b-pt-224. Needs the transformers fork
    (``arli.policies.lerobot_adapter.PI_TRANSFORMERS``)."""
    import lerobot.policies.pi0.processor_pi0 as pi0_proc  # noqa: PLC0415
    import lerobot.policies.pi05.processor_pi05 as pi05_proc  # noqa: PLC0415
    from lerobot.processor import TokenizerProcessorStep  # noqa: PLC0415

    path = Path(path)
    tokenizer_dir = path / "tokenizer"
    build_tokenizer(tokenizer_dir)
    module, make = {"pi0": (pi0_proc, pi0_proc.make_pi0_pre_post_processors),
                    "pi05": (pi05_proc, pi05_proc.make_pi05_pre_post_processors)}[kind]

    def local_tokenizer(**step_kw):
        return TokenizerProcessorStep(**{**step_kw, "tokenizer_name": str(tokenizer_dir)})

    cfg = _config(kind, N, M, cameras, paligemma_variant="gemma_2b", action_expert_variant="gemma_300m",
                  chunk_size=chunk_size, n_action_steps=chunk_size, num_inference_steps=2, **kw)
    with mock.patch.object(module, "TokenizerProcessorStep", local_tokenizer):
        _save(kind, cfg, path, {"observation.state": _stats(N), "action": _stats(M)}, make)
    _relative_paths(path)
    return path
