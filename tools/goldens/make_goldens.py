#!/usr/bin/env python3
"""Model goldens from the reference implementation (transformers' Qwen3_5MoeForCausalLM, float64).

Runs on the GPU machine (torch 2.11, transformers 5.17). For each tiny checkpoint written by
`lily make-checkpoint --profile tiny --seed S`, it dequantises the MLX weights (w = s*q + b),
maps the names to transformers' (language_model.model.* -> model.*, switch_mlp gate|up ->
experts.gate_up_proj, conv1d [C,K,1] -> [C,1,K]), removes the +1 that mlx bakes into the
zero-centred norms, loads them strictly into Qwen3_5MoeForCausalLM in float64, and greedily
decodes 32 tokens for each prompt, recomputing the full sequence at every step (no cache).
It writes one JSON per (seed, prompt): prompt ids, greedy tokens, the top-16 logits of every
step, the top-2 margin, and the versions of the tools.

usage: make_goldens.py --checkpoint DIR --seed S [--checkpoint DIR --seed S ...] --out DIR
"""
import argparse
import json
import os
import platform
import struct
import sys

import numpy as np
import torch

STEPS = 32
TOP_K = 16


def read_safetensors(path):
    """Minimal safetensors reader (numpy): name -> array (BF16 widened to float32)."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[base + begin : base + end]
        dtype = entry["dtype"]
        if dtype == "U32":
            arr = np.frombuffer(raw, dtype="<u4")
        elif dtype == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dtype == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: unsupported dtype {dtype} for {name}")
        out[name] = arr.reshape(entry["shape"])
    return out


def load_checkpoint(directory):
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for shard in shards:
        tensors.update(read_safetensors(os.path.join(directory, shard)))
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    return config, tensors


def dequantize(tensors, base):
    """MLX affine: codes packed low bits first along the input dim; w = scale*q + bias."""
    codes = tensors.pop(base + ".weight")
    scales = tensors.pop(base + ".scales").astype(np.float64)
    biases = tensors.pop(base + ".biases").astype(np.float64)
    groups = scales.shape[-1]
    in_features = groups * 64
    bits = codes.shape[-1] * 32 // in_features
    per_word = 32 // bits
    shifts = (np.arange(per_word, dtype=np.uint32) * bits).astype(np.uint32)
    q = (codes[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    q = q.reshape(*codes.shape[:-1], in_features).astype(np.float64)
    q = q.reshape(*codes.shape[:-1], groups, 64)
    w = q * scales[..., None] + biases[..., None]
    return w.reshape(*codes.shape[:-1], in_features), bits


def hf_state_dict(tensors, text_config):
    """Maps the MLX checkpoint to Qwen3_5MoeForCausalLM parameter names (float64)."""
    sd = {}
    quant_bases = sorted({k[: -len(".scales")] for k in tensors if k.endswith(".scales")})
    for base in quant_bases:
        w, _ = dequantize(tensors, base)
        sd[base] = w
    for name in list(tensors):
        sd[name] = tensors.pop(name).astype(np.float64)

    out = {}
    zero_centred = ("input_layernorm.weight", "post_attention_layernorm.weight",
                    "q_norm.weight", "k_norm.weight")
    for name, value in sd.items():
        if name.startswith("language_model.lm_head"):
            out["lm_head.weight"] = value
            continue
        assert name.startswith("language_model.model."), name
        hf = "model." + name[len("language_model.model."):]
        if hf.endswith(zero_centred) or hf == "model.norm.weight":
            value = value - 1.0  # mlx bakes 1 + w; transformers applies (1 + w)
        elif hf.endswith("linear_attn.conv1d.weight"):
            value = np.transpose(value, (0, 2, 1))  # mlx [C, K, 1] -> HF [C, 1, K]
        elif ".mlp.switch_mlp." in hf:
            continue  # fused below
        elif not hf.endswith((".A_log", ".dt_bias", "linear_attn.norm.weight")):
            hf = hf + ".weight"  # quantized projections: base name -> .weight
        out[hf] = value
    for layer in range(text_config["num_hidden_layers"]):
        p = f"language_model.model.layers.{layer}.mlp.switch_mlp."
        gate, up, down = sd[p + "gate_proj"], sd[p + "up_proj"], sd[p + "down_proj"]
        out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
        out[f"model.layers.{layer}.mlp.experts.down_proj"] = down
    return out


def prompts_for(tokenizer, seed):
    import random

    rng = random.Random(1000 + seed)
    chat = ("<|im_start|>user\nName the two colors of a chessboard.<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    plain = "The quick brown fox jumps over the lazy dog. 1234 + 5678 = 6912; naïve café 東京"
    words = ["the", "model", "state", "token", "cache", "layer", "expert", "prefix", "query",
             "value", "key", "decode", "prefill", "函数", "注意力", "привет", "नमस्ते", "def", "()",
             "\n", "  ", "{", "}", "return", "0", "7", "!", "?", "🙂"]
    long_text = " ".join(rng.choice(words) for _ in range(900))
    out = {}
    for name, text in (("chat", chat), ("plain", plain), ("long", long_text)):
        out[name] = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(out["long"]) > 600, len(out["long"])
    return out


def greedy(model, prompt_ids, device):
    ids = list(prompt_ids)
    tokens, steps, margins = [], [], []
    with torch.no_grad():
        for _ in range(STEPS):
            x = torch.tensor([ids], device=device)
            logits = model(input_ids=x, use_cache=False).logits[0, -1].double()
            top = torch.topk(logits, TOP_K)
            values = top.values.cpu().tolist()
            indices = top.indices.cpu().tolist()
            token = int(indices[0])
            tokens.append(token)
            steps.append([[int(i), float(v)] for i, v in zip(indices, values)])
            margins.append(float(values[0] - values[1]))
            ids.append(token)
    return tokens, steps, margins


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", action="append", required=True)
    parser.add_argument("--seed", action="append", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    assert len(args.checkpoint) == len(args.seed)

    import transformers
    from tokenizers import Tokenizer
    from transformers import Qwen3_5MoeForCausalLM
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    os.makedirs(args.out, exist_ok=True)
    for directory, seed in zip(args.checkpoint, args.seed):
        config, tensors = load_checkpoint(directory)
        text = dict(config["text_config"])
        text.pop("model_type", None)
        cfg = Qwen3_5MoeTextConfig(**text)
        # Plain loops everywhere: the fused grouped-mm experts and sdpa paths have no float64.
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = "eager"
        torch.manual_seed(0)
        model = Qwen3_5MoeForCausalLM(cfg)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        sd = hf_state_dict(tensors, text)
        missing = sorted(set(expected) - set(sd))
        extra = sorted(set(sd) - set(expected))
        bad = [(k, expected[k], sd[k].shape) for k in expected if k in sd and tuple(sd[k].shape) != expected[k]]
        if missing or extra or bad:
            print("missing:", missing[:20], "\nextra:", extra[:20], "\nshape mismatches:", bad[:20])
            raise SystemExit("state dict mapping does not match Qwen3_5MoeForCausalLM")
        model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()},
                              strict=True)
        model = model.to(device=device, dtype=torch.float64).eval()
        tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        for name, prompt_ids in prompts_for(tokenizer, seed).items():
            tokens, steps, margins = greedy(model, prompt_ids, device)
            golden = {
                "schema": "lily-model-golden/1",
                "generator": "tools/goldens/make_goldens.py",
                "reference": "transformers Qwen3_5MoeForCausalLM, float64, full recompute per step",
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                             "python": platform.python_version(),
                             "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"},
                "checkpoint": {"profile": "tiny", "seed": seed,
                               "command": f"lily make-checkpoint --profile tiny --seed {seed}"},
                "prompt_name": name,
                "prompt_ids": prompt_ids,
                "tokens": tokens,
                "top2_margins": margins,
                "steps": steps,
            }
            path = os.path.join(args.out, f"tiny-seed{seed}-{name}.json")
            with open(path, "w") as f:
                json.dump(golden, f, indent=1)
            print(f"{path}: {len(prompt_ids)} prompt ids, tokens {tokens[:8]}..., "
                  f"min margin {min(margins):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
