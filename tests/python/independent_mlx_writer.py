# Independent stdlib-only writer of a tiny-profile MLX-format Qwen3.6 checkpoint, written from the checkpoint contract only (not lily's source).
"""Write a complete tiny-profile Qwen3.6-35B-A3B checkpoint in the MLX on-disk layout.

Written from the checkpoint contract alone, never from lily's code; docs/checkpoint.md states it:
  * "Files", "safetensors shards", "config.json" (keys, the quantization block with its
    8-bit overrides, the marker) and "The tiny test profile" (the shape table);
  * "Tensor inventory" (names and shapes, Q4/Q8, conv1d [C, K, 1], +1 baked into every
    norm except linear_attn.norm) and "MLX affine quantization" (U32 codes packed low bits
    first along the input dimension, BF16 scales/biases [out, in/64]);
  * "tokenizer.json" (the Qwen3.6 tokenizer: split pattern, the 33 added tokens in
    production order).

The file layout is deliberately different from any "natural" writer: tensors are spread
over several shards at random, the header lists them in a shuffled (non-alphabetical)
order, the data section stores them in yet another order, and the JSON header is padded
with spaces to a multiple of 8 bytes.

Only the Python 3.11 standard library is used. Output is a deterministic function of the
arguments (seeded random.Random instances; no hash randomisation, no clocks).

On success one JSON line describing what was written is printed to stdout (the test
driver reads it, e.g. to learn which tensor --break missing-tensor dropped).
"""

from __future__ import annotations

import argparse
import array
import json
import math
import os
import random
import struct
import sys

# ---------------------------------------------------------------------------------------
# The tiny profile (docs/checkpoint.md, "The tiny test profile").
# ---------------------------------------------------------------------------------------
TINY = {
    "hidden_size": 256,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "attn_output_gate": True,
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000000,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 32,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "vocab_size": 4096,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
}
GROUP_SIZE = 64
DEFAULT_BITS = 4
GATE_BITS = 8  # router (mlp.gate) and mlp.shared_expert_gate

# The 33 added tokens in production order (248044..248076; docs/checkpoint.md, "tokenizer.json").
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
    "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
    "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
]
assert len(SPECIAL_TOKENS) == 33
FIRST_SPECIAL_ID = TINY["vocab_size"] - len(SPECIAL_TOKENS)  # 4063: BPE ids 0..4062 first


def special_id(tok: str) -> int:
    return FIRST_SPECIAL_ID + SPECIAL_TOKENS.index(tok)


# The Qwen3.5/3.6 split pattern (docs/checkpoint.md, "tokenizer.json"; exact string).
QWEN35_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LM = "language_model.model."
DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "U32": 4}


# ---------------------------------------------------------------------------------------
# Encoding helpers (little-endian on disk regardless of the host).
# ---------------------------------------------------------------------------------------
def _le(arr: array.array) -> bytes:
    if sys.byteorder != "little":
        arr = array.array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def f32_bytes(values) -> bytes:
    return struct.pack("<%df" % len(values), *values)


def f16_bytes(values) -> bytes:
    return struct.pack("<%de" % len(values), *values)


def bf16_bytes(values) -> bytes:
    """Round-to-nearest-even float32 -> bfloat16 (values are finite here)."""
    bits = array.array("I")
    bits.frombytes(struct.pack("=%df" % len(values), *values))
    out = array.array("H", [((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF for b in bits])
    return _le(out)


def pack_codes(codes, bits: int) -> bytes:
    """MLX affine packing: codes packed into u32 words, element-ascending from the LSB."""
    per_word = 32 // bits
    assert len(codes) % per_word == 0
    words = array.array("I")
    for w in range(0, len(codes), per_word):
        word = 0
        for j in range(per_word):
            word |= (codes[w + j] & ((1 << bits) - 1)) << (bits * j)
        words.append(word)
    return _le(words)


# Self-check against the packing example in docs/checkpoint.md, "MLX affine quantization".
assert pack_codes([0, 0, 1, 1, 1, 1, 2, 2], 4) == struct.pack("<I", 0x22111100)


# ---------------------------------------------------------------------------------------
# Tensor inventory (docs/checkpoint.md, "Tensor inventory").
# ---------------------------------------------------------------------------------------
class Tensor:
    __slots__ = ("name", "dtype", "shape", "data")

    def __init__(self, name: str, dtype: str, shape: list[int], data: bytes):
        n = 1
        for d in shape:
            n *= d
        assert len(data) == n * DTYPE_SIZE[dtype], (name, dtype, shape, len(data))
        self.name, self.dtype, self.shape, self.data = name, dtype, list(shape), data


class Gen:
    """All random content comes from one seeded random.Random, in inventory order."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def quantized(self, base: str, lead: list[int], out: int, inp: int, bits: int) -> list[Tensor]:
        """Codes U32 [*lead, out, inp*bits/32], scales/biases BF16 [*lead, out, inp/64]."""
        assert inp % GROUP_SIZE == 0 and (inp * bits) % 32 == 0
        rows = out
        for d in lead:
            rows *= d
        cols = inp * bits // 32
        groups = inp // GROUP_SIZE
        rng = self.rng
        if rows * inp <= 65536:
            # Small tensors: draw explicit codes and pack them (the format as specified).
            codes = [rng.randrange(1 << bits) for _ in range(rows * inp)]
            code_bytes = pack_codes(codes, bits)
        else:
            # Large stacks: a uniformly random u32 word is exactly the packing of
            # 32/bits independent uniform codes, so draw the words directly.
            code_bytes = rng.randbytes(rows * cols * 4)
        qmax = (1 << bits) - 1
        scales, biases = [], []
        for _ in range(rows * groups):
            s = rng.uniform(0.002, 0.03) * (16.0 / (qmax + 1)) ** 0.5
            scales.append(s)
            biases.append(-s * qmax / 2.0 * rng.uniform(0.8, 1.2))
        return [
            Tensor(base + ".weight", "U32", lead + [out, cols], code_bytes),
            Tensor(base + ".scales", "BF16", lead + [out, groups], bf16_bytes(scales)),
            Tensor(base + ".biases", "BF16", lead + [out, groups], bf16_bytes(biases)),
        ]

    def floats(self, name: str, dtype: str, shape: list[int], center: float, spread: float) -> Tensor:
        n = 1
        for d in shape:
            n *= d
        vals = [center + self.rng.gauss(0.0, spread) for _ in range(n)]
        enc = {"BF16": bf16_bytes, "F32": f32_bytes, "F16": f16_bytes}[dtype]
        return Tensor(name, dtype, shape, enc(vals))

    def values(self, name: str, dtype: str, shape: list[int], vals: list[float]) -> Tensor:
        enc = {"BF16": bf16_bytes, "F32": f32_bytes, "F16": f16_bytes}[dtype]
        return Tensor(name, dtype, shape, enc(vals))


def layer_is_full(i: int) -> bool:
    return i % 4 == 3


def build_tensors(args, gen: Gen) -> list[Tensor]:
    c = TINY
    H = c["hidden_size"]
    V = c["vocab_size"]
    E = c["num_experts"]
    I_moe = c["moe_intermediate_size"]
    I_sh = c["shared_expert_intermediate_size"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    K = c["linear_conv_kernel_dim"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    conv_ch = 2 * nk * dk + nv * dv  # q, k, v channels
    out: list[Tensor] = []
    Q = gen.quantized

    out += Q(LM + "embed_tokens", [], V, H, DEFAULT_BITS)
    for i in range(c["num_hidden_layers"]):
        p = f"{LM}layers.{i}."
        # Zero-centred norms with the +1 already baked in (MLX): values around 1.0.
        out.append(gen.floats(p + "input_layernorm.weight", "BF16", [H], 1.0, 0.05))
        out.append(gen.floats(p + "post_attention_layernorm.weight", "BF16", [H], 1.0, 0.05))
        if layer_is_full(i):
            a = p + "self_attn."
            out += Q(a + "q_proj", [], nh * hd * 2, H, DEFAULT_BITS)  # query + output gate
            out += Q(a + "k_proj", [], nkv * hd, H, DEFAULT_BITS)
            out += Q(a + "v_proj", [], nkv * hd, H, DEFAULT_BITS)
            out += Q(a + "o_proj", [], H, nh * hd, DEFAULT_BITS)
            out.append(gen.floats(a + "q_norm.weight", "BF16", [hd], 1.0, 0.05))
            out.append(gen.floats(a + "k_norm.weight", "BF16", [hd], 1.0, 0.05))
        else:
            a = p + "linear_attn."
            out += Q(a + "in_proj_qkv", [], conv_ch, H, DEFAULT_BITS)
            out += Q(a + "in_proj_z", [], nv * dv, H, DEFAULT_BITS)
            out += Q(a + "in_proj_a", [], nv, H, DEFAULT_BITS)
            out += Q(a + "in_proj_b", [], nv, H, DEFAULT_BITS)
            # Depthwise conv: MLX layout [C, K, 1]; HF layout [C, 1, K]. Both are
            # channel-major with the K taps contiguous, so the bytes are identical.
            conv_shape = [conv_ch, K, 1] if args.conv_layout == "mlx" else [conv_ch, 1, K]
            out.append(gen.floats(a + "conv1d.weight", "BF16", conv_shape, 0.0, 0.3))
            a_dtype = "F32" if args.a_log_dtype == "f32" else "BF16"
            out.append(gen.values(a + "A_log", a_dtype, [nv],
                                  [math.log(gen.rng.uniform(1.0, 16.0)) for _ in range(nv)]))
            out.append(gen.floats(a + "dt_bias", "BF16", [nv], 0.0, 0.5))
            # Gated RMSNorm: plain gain, NOT shifted by +1.
            out.append(gen.floats(a + "norm.weight", "BF16", [dv], 1.0, 0.1))
            out += Q(a + "out_proj", [], H, nv * dv, DEFAULT_BITS)
        m = p + "mlp."
        router_bits = 4 if (args.break_ == "router-4bit" and i == 0) else GATE_BITS
        out += Q(m + "gate", [], E, H, router_bits)
        out += Q(m + "switch_mlp.gate_proj", [E], I_moe, H, DEFAULT_BITS)
        out += Q(m + "switch_mlp.up_proj", [E], I_moe, H, DEFAULT_BITS)
        out += Q(m + "switch_mlp.down_proj", [E], H, I_moe, DEFAULT_BITS)
        out += Q(m + "shared_expert.gate_proj", [], I_sh, H, DEFAULT_BITS)
        out += Q(m + "shared_expert.up_proj", [], I_sh, H, DEFAULT_BITS)
        out += Q(m + "shared_expert.down_proj", [], H, I_sh, DEFAULT_BITS)
        out += Q(m + "shared_expert_gate", [], 1, H, GATE_BITS)
    out.append(gen.floats(LM + "norm.weight", "BF16", [H], 1.0, 0.05))
    out += Q("language_model.lm_head", [], V, H, DEFAULT_BITS)
    return out


def vision_tensors(gen: Gen) -> list[Tensor]:
    """A few vision-tower tensors in dtypes the text loader never reads (F32/F16).

    Odd element counts on purpose, so the tensors stored after them in the data section
    start at offsets that are not multiples of 4 (safetensors does not require alignment)."""
    return [
        gen.floats("vision_tower.patch_embed.proj.weight", "F32", [4, 3, 2, 2, 2], 0.0, 0.02),
        gen.floats("vision_tower.blocks.0.norm1.weight", "F16", [3, 5], 1.0, 0.05),
        gen.floats("vision_tower.blocks.0.attn.qkv.weight", "F16", [48, 17], 0.0, 0.02),
        gen.floats("vision_tower.blocks.0.attn.qkv.bias", "F32", [7], 0.0, 0.02),
        gen.floats("vision_tower.merger.mlp.0.bias", "F16", [9], 0.0, 0.02),
    ]


# ---------------------------------------------------------------------------------------
# config.json (docs/checkpoint.md, "config.json" and "The tiny test profile").
# ---------------------------------------------------------------------------------------
def build_config(args, n_layers: int) -> dict:
    c = TINY
    layer_types = ["full_attention" if layer_is_full(i) else "linear_attention" for i in range(n_layers)]
    eot = special_id("<|endoftext|>")
    text_config = {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": c["hidden_size"],
        "num_hidden_layers": n_layers,
        "layer_types": layer_types,
        "full_attention_interval": 4,
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["head_dim"],
        "attn_output_gate": c["attn_output_gate"],
        "partial_rotary_factor": c["partial_rotary_factor"],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": c["rope_theta"],
            "partial_rotary_factor": c["partial_rotary_factor"],
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
        },
        "max_position_embeddings": c["max_position_embeddings"],
        "linear_num_key_heads": c["linear_num_key_heads"],
        "linear_num_value_heads": c["linear_num_value_heads"],
        "linear_key_head_dim": c["linear_key_head_dim"],
        "linear_value_head_dim": c["linear_value_head_dim"],
        "linear_conv_kernel_dim": c["linear_conv_kernel_dim"],
        "mamba_ssm_dtype": "float32",
        "num_experts": c["num_experts"],
        "num_experts_per_tok": c["num_experts_per_tok"],
        "moe_intermediate_size": c["moe_intermediate_size"],
        "shared_expert_intermediate_size": c["shared_expert_intermediate_size"],
        "router_aux_loss_coef": 0.001,
        "mlp_only_layers": [],
        "hidden_act": "silu",
        "rms_norm_eps": c["rms_norm_eps"],
        "vocab_size": c["vocab_size"],
        "tie_word_embeddings": c["tie_word_embeddings"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "eos_token_id": eot,
        "bos_token_id": eot,
        "pad_token_id": None,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "dtype": "bfloat16",
    }
    quant = {"group_size": GROUP_SIZE, "bits": DEFAULT_BITS, "mode": "affine"}
    for i in range(n_layers):
        quant[f"{LM}layers.{i}.mlp.gate"] = {"group_size": GROUP_SIZE, "bits": GATE_BITS}
        quant[f"{LM}layers.{i}.mlp.shared_expert_gate"] = {"group_size": GROUP_SIZE, "bits": GATE_BITS}
    cfg = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
    }
    if args.break_ != "tiny-without-marker":
        cfg["lily_test_profile"] = "tiny"
    cfg.update({
        "image_token_id": special_id("<|image_pad|>"),
        "video_token_id": special_id("<|video_pad|>"),
        "vision_start_token_id": special_id("<|vision_start|>"),
        "vision_end_token_id": special_id("<|vision_end|>"),
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "eos_token_id": [special_id("<|im_end|>"), eot] if args.eos_list else eot,
        "text_config": text_config,
        "vision_config": {
            "model_type": "qwen3_5_moe_vision",
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 48,
            "num_heads": 2,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": c["hidden_size"],
            "hidden_act": "gelu_pytorch_tanh",
            "deepstack_visual_indexes": [],
        },
        "quantization": quant,
        # mlx-lm also writes the same block under this key; lily ignores unknown keys.
        "quantization_config": dict(quant),
    })
    return cfg


# ---------------------------------------------------------------------------------------
# Tokenizer (docs/checkpoint.md, "tokenizer.json" and the tiny tokenizer rule).
# ---------------------------------------------------------------------------------------
def bytes_to_unicode() -> list[tuple[int, str]]:
    """GPT-2 byte-level alphabet, in the usual vocabulary order (printables first)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [(b, chr(ch)) for b, ch in zip(bs, cs)]


def build_tokenizer(seed: int) -> tuple[dict, dict]:
    n_bpe = FIRST_SPECIAL_ID
    alphabet = [ch for _, ch in bytes_to_unicode()]
    vocab: dict[str, int] = {}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    merges: list[list[str]] = []

    def merge(a: str, b: str) -> None:
        if len(vocab) >= n_bpe or a not in vocab or b not in vocab or (a + b) in vocab:
            return
        merges.append([a, b])
        vocab[a + b] = len(vocab)

    # A few realistic merges ("Ġ" is the byte-level space, "Ċ" the newline).
    for a, b in [("Ġ", "t"), ("Ġ", "a"), ("h", "e"), ("i", "n"), ("r", "e"), ("o", "n"),
                 ("Ġt", "he"), ("e", "r"), ("Ġ", "s"), ("a", "t"), ("Ġ", "w"), ("Ġ", "o"),
                 ("e", "n"), ("Ġ", "c"), ("i", "t"), ("i", "s"), ("a", "n"), ("o", "r"),
                 ("e", "s"), ("Ġ", "b"), ("e", "d"), ("Ġ", "f"), ("in", "g"), ("Ġ", "h"),
                 ("l", "l"), ("Ġ", "i"), ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld"), ("he", "ll"),
                 ("hell", "o"), ("Ġh", "ello"), ("u", "s"), ("Ġ", "u"), ("Ġu", "s"), ("Ġus", "er"),
                 ("Ċ", "Ċ"), ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ")]:
        merge(a, b)
    # Fill the remaining BPE ids with two-symbol merges over a printable alphabet,
    # in a seed-dependent but deterministic order.
    sym = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ", "Ċ"]
    pairs = [(a, b) for a in sym for b in sym]
    random.Random(f"tokenizer-{seed}").shuffle(pairs)
    for a, b in pairs:
        if len(vocab) >= n_bpe:
            break
        merge(a, b)
    assert len(vocab) == n_bpe, len(vocab)

    added = [{"id": FIRST_SPECIAL_ID + k, "content": t, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for k, t in enumerate(SPECIAL_TOKENS)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN35_SPLIT_REGEX}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    tok_cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": TINY["max_position_embeddings"],
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    return tokenizer, tok_cfg


# ---------------------------------------------------------------------------------------
# safetensors writing.
# ---------------------------------------------------------------------------------------
def write_safetensors(path: str, tensors: list[Tensor], rng: random.Random) -> int:
    """Header in one shuffled order, data in another; header padded to 8 bytes."""
    header_order = tensors[:]
    rng.shuffle(header_order)
    names = [t.name for t in header_order]
    if len(names) > 2 and names == sorted(names):
        header_order.reverse()
    data_order = header_order[:]
    if len(data_order) > 1:
        while [t.name for t in data_order] == [t.name for t in header_order]:
            rng.shuffle(data_order)
    offsets: dict[str, tuple[int, int]] = {}
    pos = 0
    for t in data_order:
        offsets[t.name] = (pos, pos + len(t.data))
        pos += len(t.data)
    header: dict = {"__metadata__": {"format": "mlx"}}
    for t in header_order:
        header[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": list(offsets[t.name])}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((-len(hbytes)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for t in data_order:
            f.write(t.data)
    return pos


def write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (created; existing files overwritten)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=3, help="number of shards (ignored with --single-file)")
    ap.add_argument("--conv-layout", choices=["mlx", "hf"], default="mlx",
                    help="conv1d as MLX [C, 4, 1] (default) or HF [C, 1, 4]")
    ap.add_argument("--a-log-dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--vision-tower", action="store_true", help="add vision_tower.* tensors (F32/F16)")
    ap.add_argument("--single-file", action="store_true", help="one model.safetensors, no index")
    ap.add_argument("--eos-list", action="store_true", help="top-level eos_token_id as a list")
    ap.add_argument("--break", dest="break_", default=None,
                    choices=["router-4bit", "missing-tensor", "extra-tensor", "tiny-without-marker"],
                    help="write a checkpoint lily must refuse")
    ap.add_argument("--drop", default=None, help="with --break missing-tensor: the tensor to drop")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error("--shards must be >= 1")

    gen = Gen(args.seed)
    lm_tensors = build_tensors(args, gen)
    summary: dict = {"out": args.out, "seed": args.seed, "break": args.break_,
                     "conv_layout": args.conv_layout, "a_log_dtype": args.a_log_dtype}
    if args.break_ == "missing-tensor":
        names = [t.name for t in lm_tensors]
        drop = args.drop if args.drop is not None else random.Random(f"drop-{args.seed}").choice(names)
        if drop not in names:
            ap.error(f"--drop {drop}: no such tensor")
        lm_tensors = [t for t in lm_tensors if t.name != drop]
        summary["dropped"] = drop
    if args.break_ == "extra-tensor":
        extra = LM + "mtp_extra.weight"
        lm_tensors.append(gen.floats(extra, "BF16", [TINY["hidden_size"]], 1.0, 0.05))
        summary["extra"] = extra
    vis = vision_tensors(gen) if args.vision_tower else []
    all_tensors = lm_tensors + vis
    assert len({t.name for t in all_tensors}) == len(all_tensors)

    os.makedirs(args.out, exist_ok=True)
    for stale in os.listdir(args.out):
        if stale.endswith(".safetensors") or stale == "model.safetensors.index.json":
            os.remove(os.path.join(args.out, stale))

    layout = random.Random(f"layout-{args.seed}")
    files: list[str] = []
    if args.single_file:
        write_safetensors(os.path.join(args.out, "model.safetensors"), all_tensors, layout)
        files.append("model.safetensors")
    else:
        n = min(args.shards, len(all_tensors))
        shard_names = [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
        buckets: list[list[Tensor]] = [[] for _ in range(n)]
        # Random spread (triples may straddle shards), each shard non-empty.
        order = all_tensors[:]
        layout.shuffle(order)
        for k, t in enumerate(order):
            buckets[k if k < n else layout.randrange(n)].append(t)
        weight_map: dict[str, str] = {}
        total = 0
        for k in range(n):
            total += write_safetensors(os.path.join(args.out, shard_names[k]), buckets[k], layout)
            for t in buckets[k]:
                weight_map[t.name] = shard_names[k]
        write_json(os.path.join(args.out, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total},
                    "weight_map": {k: weight_map[k] for k in sorted(weight_map)}})
        files += shard_names + ["model.safetensors.index.json"]

    write_json(os.path.join(args.out, "config.json"), build_config(args, TINY["num_hidden_layers"]))
    tokenizer, tok_cfg = build_tokenizer(args.seed)
    write_json(os.path.join(args.out, "tokenizer.json"), tokenizer)
    write_json(os.path.join(args.out, "tokenizer_config.json"), tok_cfg)
    files += ["config.json", "tokenizer.json", "tokenizer_config.json"]

    summary.update({"files": files, "language_model_tensors": len(lm_tensors),
                    "vision_tensors": len(vis), "single_file": args.single_file})
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
