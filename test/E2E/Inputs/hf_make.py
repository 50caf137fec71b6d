#!/usr/bin/env python3
"""Makes a small Hugging Face model directory with random weights.

Usage: hf_make.py --arch llama|qwen3|mixtral|mistral|gpt2 OUT [--bf16]
           [--fp16] [--tie] [--untie] [--vocab 258] [--max-shard-size 100KB]
           [--no-prefix]

Builds the transformers model from a small config (hidden 64, 8 heads in 2
key/value groups, 2 layers; Mixtral: 4 experts, top 2) with transformers'
own random initialisation (seed 0; GPT-2: hidden 64, 4 heads, gelu_new)
and saves it with save_pretrained
(config.json and model.safetensors, or shards and their index with
--max-shard-size), as a user would before compiling it with
tessera-compile OUT. --no-prefix (GPT-2) renames the tensors as a
GPT2Model's save has them (no "transformer.").
"""
import argparse

import torch
import transformers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", required=True,
                    choices=["llama", "qwen3", "mixtral", "mistral", "gpt2"])
    ap.add_argument("out")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--max-shard-size", default="5GB")
    ap.add_argument("--no-prefix", action="store_true")
    ap.add_argument("--tie", action="store_true")
    ap.add_argument("--untie", action="store_true",
                    help="GPT-2 with its own lm_head")
    ap.add_argument("--vocab", type=int, default=258)
    args = ap.parse_args()
    torch.manual_seed(0)
    common = dict(vocab_size=args.vocab, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=args.tie, initializer_range=0.05)
    if args.arch == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=args.vocab, n_embd=64, n_layer=2, n_head=4,
            n_positions=64, activation_function="gelu_new",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            tie_word_embeddings=not args.untie, initializer_range=0.05)
    elif args.arch == "llama":
        config = transformers.LlamaConfig(**common)
    elif args.arch == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=None)
    elif args.arch == "qwen3":
        config = transformers.Qwen3Config(**common, head_dim=8)
    else:
        config = transformers.MixtralConfig(**common, num_local_experts=4,
                                            num_experts_per_tok=2)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if args.bf16:
        model = model.to(torch.bfloat16)
    if args.fp16:
        model = model.to(torch.float16)
    model.save_pretrained(args.out, safe_serialization=True,
                          max_shard_size=args.max_shard_size)
    if args.no_prefix:
        from safetensors.torch import load_file, save_file
        path = args.out + "/model.safetensors"
        tensors = load_file(path)
        save_file({k.removeprefix("transformer."): v
                   for k, v in tensors.items()}, path, metadata={"format": "pt"})


if __name__ == "__main__":
    main()
