#!/usr/bin/env python3
"""Exports small Hugging Face models the way current PyTorch exports them.

Usage: make_hf_onnx_fixtures.py [--out DIR]

Needs torch 2.9, transformers 4.57, onnx and onnxscript 0.7 (the dynamo
exporter of torch 2.9 needs onnxscript >= 0.6.2): for example
    python3 -m venv /tmp/export-venv && /tmp/export-venv/bin/pip install \\
        torch==2.9.1 transformers==4.57.1 onnx==1.19.1 onnxscript==0.7.2
The build and the tests need none of them: the exports are committed.

For each model (random weights, initializer_range 0.05, seed 1234;
vocabulary 257 for the bytes tessera-preprocess makes, 2 layers, hidden 64,
8 heads in 2 key/value groups, sequence 32, eager attention) the script
writes the transformers directory NAME/ (config.json, model.safetensors:
the reference trains it with test/E2E/Inputs/hf_train.py) and ONNX exports
of a module whose forward is `model(input_ids, labels=labels).loss`
(Hugging Face's causal-LM loss, labels shifted inside), traced at batch 2:
  NAME.dynamo18.onnx       torch.onnx.export(dynamo=True, opset 18)
  NAME.torchscript18.onnx  torch.onnx.export(dynamo=False, opset 18)
Models: llama (LlamaForCausalLM: RMSNorm, SwiGLU, RoPE, GQA, untied head),
qwen3 (Qwen3ForCausalLM: the same with QK-norm; dynamo only) and gpt2
(GPT2LMHeadModel: LayerNorm, tanh GELU, learned positions, Conv1D, tied
head; 4 heads; dropout 0; its biases drawn non-zero, as a pretrained
model's are, since the dynamo exporter drops an added zero) and mistral
(MistralForCausalLM, dynamo only). A
one-layer Llama (hidden 32, 4 heads) is exported twice more for the output
forms: tiny-logits-loss.dynamo18.onnx returns (logits, loss), and
tiny-logits.dynamo18.onnx only the logits of input_ids; with SDPA attention,
tiny-sdpa.dynamo18.onnx and, at opset 23 (where the exporter emits
RMSNormalization and Attention ops), tiny-sdpa.dynamo23.onnx (their
transformers directory tiny/). A one-layer Mixtral (4 experts, top 2)
exports only through TorchScript (the dynamo exporter cannot trace its
data-dependent expert loop): mixtral-tiny-logits.torchscript18.onnx, whose
import is refused with that reason (`--only mixtral` writes it alone). A
two-layer Qwen2 (q/k/v biases) whose biases all start at 0.05 exports its
logits as qwen2-shared-bias.dynamo18.onnx: the dynamo exporter merges the
equal biases into two initializers that every layer's q, and k and v, read
(`--only qwen2` writes it alone; tessera-export must split them).
"""
import argparse
import os

import torch
import transformers

SEQ, BATCH, SEED = 32, 2, 1234


class WithLoss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss


class LogitsAndLoss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        out = self.model(input_ids=input_ids, labels=labels, use_cache=False)
        return out.logits, out.loss


class LogitsOnly(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


class MasksWithoutVmap:
    """transformers 4.57 builds attention masks with torch.vmap, which the
    TorchScript exporter cannot trace; its executorch integration has the
    same mask without vmap."""

    def __enter__(self):
        import transformers.masking_utils as mu
        from transformers.integrations.executorch import sdpa_mask_without_vmap
        self.mu, self.saved = mu, mu.sdpa_mask
        mu.sdpa_mask = sdpa_mask_without_vmap

    def __exit__(self, *exc):
        self.mu.sdpa_mask = self.saved
        return False


def make(name, attn="eager"):
    common = dict(vocab_size=257, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, max_position_embeddings=SEQ,
                  rms_norm_eps=1e-5, initializer_range=0.05,
                  tie_word_embeddings=False, use_cache=False)
    if name == "tiny":  # one small layer, for the output forms
        common.update(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4)
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=257, n_embd=64, n_layer=2, n_head=4,
                                      n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, initializer_range=0.05,
                                      use_cache=False)
        cfg._attn_implementation = attn
        torch.manual_seed(SEED)
        model = transformers.GPT2LMHeadModel(cfg).eval()
        # Biases start at zero, and the dynamo exporter drops an Add of
        # zeros: a pretrained model's are not, so neither are these.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith(".bias"):
                    p.normal_(0.0, 0.02)
        return model
    if name in ("llama", "tiny"):
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    elif name == "mistral":  # sliding window longer than the sequence: causal
        cfg, cls = (transformers.MistralConfig(**common, head_dim=8, sliding_window=4096),
                    transformers.MistralForCausalLM)
    else:
        cfg, cls = (transformers.Qwen3Config(**common, head_dim=8),
                    transformers.Qwen3ForCausalLM)
    cfg._attn_implementation = attn
    torch.manual_seed(SEED)
    return cls(cfg).eval()


def export_mixtral(out, ids):
    """The TorchScript export of a one-layer Mixtral's logits; its expert
    loop is unrolled over the experts the example routes to."""
    cfg = transformers.MixtralConfig(vocab_size=257, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=SEQ,
                                     use_cache=False)
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = transformers.MixtralForCausalLM(cfg).eval()
    path = os.path.join(out, "mixtral-tiny-logits.torchscript18.onnx")
    with MasksWithoutVmap():
        torch.onnx.export(LogitsOnly(model), (ids,), path, dynamo=False,
                          do_constant_folding=False, input_names=["input_ids"],
                          opset_version=18)
    print("wrote", path)


def export_qwen2_shared(out, ids):
    """A Qwen2 whose equal q/k/v biases the dynamo exporter merges."""
    cfg = transformers.Qwen2Config(vocab_size=257, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=SEQ,
                                   rms_norm_eps=1e-5, initializer_range=0.05,
                                   tie_word_embeddings=False, use_cache=False)
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.fill_(0.05)
    path = os.path.join(out, "qwen2-shared-bias.dynamo18.onnx")
    torch.onnx.export(LogitsOnly(model), (ids,), path, dynamo=True, external_data=False,
                      input_names=["input_ids"], opset_version=18)
    print("wrote", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "hf-onnx"))
    ap.add_argument("--only", choices=["mixtral", "qwen2"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ids = torch.randint(0, 257, (BATCH, SEQ), generator=torch.Generator().manual_seed(SEED))
    if args.only == "mixtral":
        return export_mixtral(args.out, ids)
    if args.only == "qwen2":
        return export_qwen2_shared(args.out, ids)
    # Distinct tensors: the dynamo exporter merges inputs traced from one.
    labels = ids.clone()
    for name, exporters in [("llama", ["dynamo", "torchscript"]), ("qwen3", ["dynamo"]),
                            ("gpt2", ["dynamo", "torchscript"]), ("mistral", ["dynamo"])]:
        model = make(name)
        model.save_pretrained(os.path.join(args.out, name), safe_serialization=True)
        for exporter in exporters:
            path = os.path.join(args.out, f"{name}.{exporter}18.onnx")
            kw = dict(input_names=["input_ids", "labels"], opset_version=18)
            if exporter == "dynamo":
                torch.onnx.export(WithLoss(model), (ids, labels), path, dynamo=True,
                                  external_data=False, **kw)
            else:
                with MasksWithoutVmap():
                    torch.onnx.export(WithLoss(model), (ids, labels), path, dynamo=False,
                                      do_constant_folding=False, **kw)
            print("wrote", path)
    # The output forms: (logits, loss), and logits alone (--loss).
    model = make("tiny")
    path = os.path.join(args.out, "tiny-logits-loss.dynamo18.onnx")
    torch.onnx.export(LogitsAndLoss(model), (ids, labels), path, dynamo=True,
                      external_data=False, input_names=["input_ids", "labels"],
                      opset_version=18)
    print("wrote", path)
    path = os.path.join(args.out, "tiny-logits.dynamo18.onnx")
    torch.onnx.export(LogitsOnly(model), (ids,), path, dynamo=True, external_data=False,
                      input_names=["input_ids"], opset_version=18)
    print("wrote", path)
    # SDPA attention (its decomposition: q and k^T each scaled by
    # sqrt(scale), a Where(IsNaN) guard after the softmax), with the loss.
    model = make("tiny", attn="sdpa")
    model.save_pretrained(os.path.join(args.out, "tiny"), safe_serialization=True)
    for opset in (18, 23):  # opset 23: RMSNormalization and Attention ops
        path = os.path.join(args.out, f"tiny-sdpa.dynamo{opset}.onnx")
        torch.onnx.export(WithLoss(model), (ids, labels), path, dynamo=True,
                          external_data=False, input_names=["input_ids", "labels"],
                          opset_version=opset)
        print("wrote", path)
    export_mixtral(args.out, ids)
    export_qwen2_shared(args.out, ids)


if __name__ == "__main__":
    main()
