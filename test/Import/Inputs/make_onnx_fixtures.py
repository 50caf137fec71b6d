#!/usr/bin/env python3
"""Exports the ONNX import fixtures with PyTorch and records PyTorch's losses.

Usage: make_onnx_fixtures.py --data PREFIX [--out DIR] [--steps 10]

Needs Debian's python3-torch (run with /usr/bin/python3); prints "skipped"
and exits 0 where torch is not installed. --data is the Megatron indexed
dataset tessera-preprocess makes from examples/data/northanger_abbey_vol1.txt
(test/Import/onnx-parity.test shows the command).

Each model is exported the way users export for training: the TorchScript
exporter (torch.onnx.export), opset 17, training mode, constant folding
off, weights inline. For each <name>.onnx the script also writes
<name>.torch.jsonl: PyTorch's loss and gradient norm at each of --steps
AdamW steps with tessera-compile's defaults (lr 1e-3, betas 0.9/0.999, eps
1e-8, weight decay 0.01 except on biases and 1-D parameters, gradients
clipped to norm 1.0) from the exported weights, one JSON line {"step": i,
"loss": l, "grad_norm": g} per step, the format of tessera-run --metrics. A step is a global batch of 8 samples in 2 microbatches of 4,
each microbatch's loss its own mean, the step's loss the mean over the
microbatches (Megatron's accumulation; tessera-run --micro-batch-size 4
--global-batch-size 8 runs the same).

Models (small, so that the fixtures can be committed):
  mlp.onnx        features [32, 32] -> Linear 64 -> GELU -> Linear 32 -> ReLU
                  -> Linear 8 classes; cross-entropy on labels [32]. Data:
                  tessera-run's synthetic classification task (seed 1234),
                  reproduced here with its Philox streams; its steps are
                  global batches of 64 in 2 microbatches of 32.
  gpt.onnx        Megatron-shaped GPT: vocab 260, hidden 32, 4 heads,
                  2 layers, seq 16; pre-LayerNorm, QKV fused per head
                  ([s, b, heads, 3 * head_dim]), causal mask, exact-erf
                  GELU, learned position embeddings, untied LM head without
                  bias; SoftmaxCrossEntropyLoss (mean, ignore_index -100)
                  inside the graph. Inputs input_ids and labels [4, 16]
                  int64 (batch-major, as PyTorch models are). Data: the
                  indexed dataset, sampled as tessera-run --data does.
  gpt-tied.onnx   the same GPT with the LM head tied to the word embedding.
  gpt-ext.onnx    gpt.onnx with its weights in the external-data file
                  gpt-ext.onnx.data (the form models over 2 GB take).
  gpt-dynamic.onnx gpt.onnx's model and weights exported with a dynamic
                  batch axis (reference gpt.torch.jsonl).
  gpt-dropout.onnx the GPT with hidden dropout 0.1 (embedding and both
                  residual branches); imported as nn.dropout with Tessera's
                  position-keyed masks, so it has no PyTorch reference.
  gpt-logits.onnx gpt.onnx's model and weights exported forward-only
                  (input_ids -> logits [4, 16, 260]); with --loss
                  cross-entropy it trains as gpt.onnx does, so its reference
                  is gpt.torch.jsonl.
  gpt2-hf.onnx    GPT-2 in Hugging Face's module layout (Conv1D weights
                  [in, out], QKV as [q][k][v] blocks, tril-buffer mask,
                  gelu_new, tied LM head), forward-only; with --loss cross-entropy its
                  reference is gpt2-hf.torch.jsonl.
  gpt-sep-qkv.onnx the GPT with separate q, k and v projections (q_proj,
                  k_proj, v_proj, o_proj), fused into one projection at
                  import.
  bad/*.onnx      tiny models the importer rejects: an unsupported op
                  (sigmoid), a supported op outside its pattern (softmax
                  between two linears), a weight shared by two linears, opset
                  13, an op in a custom domain, dropout on [batch,
                  features] activations, a Transpose whose perm is not a
                  permutation (it crashed onnx's shape inference), an
                  initializer with a negative dimension, and a MatMul with
                  one input (the onnx checker's error).
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 1234
MICRO, GLOBAL = 4, 8
MLP_MICRO, MLP_GLOBAL = 32, 64


def onnx_proto():
    """The onnx_pb2 module, compiled on the fly from libonnx-dev's
    onnx.proto with protoc (python3-protobuf runs it); None where one of
    them is missing. The fixtures below that rewrite a model need it."""
    import shutil
    import subprocess
    import tempfile
    proto = "/usr/include/onnx/onnx.proto"
    if not shutil.which("protoc") or not os.path.exists(proto):
        return None
    tmp = tempfile.mkdtemp()
    subprocess.run(["protoc", "-I/usr/include/onnx", "--python_out=" + tmp, proto],
                   check=True)
    sys.path.insert(0, tmp)
    try:
        import onnx_pb2
    except ImportError:
        return None
    return onnx_pb2


def rewrite(src, dst, change):
    """Writes the model `src` as `dst` after change(model, onnx_pb2)."""
    pb = onnx_proto()
    if pb is None:
        print("skipped", dst, ": needs protoc, libonnx-dev and python3-protobuf")
        return
    model = pb.ModelProto()
    with open(src, "rb") as f:
        model.ParseFromString(f.read())
    change(model, pb)
    with open(dst, "wb") as f:
        f.write(model.SerializeToString())


def to_external_data(src, dst):
    """`src` as `dst` with its initializers in ONNX's external-data form
    (the form of models over 2 GB, which torch.onnx.export only uses for
    those): raw data moved to `dst`.data, each TensorProto naming location,
    offset and length."""
    data_name = os.path.basename(dst) + ".data"

    def change(model, pb):
        offset = 0
        with open(dst + ".data", "wb") as data:
            for t in model.graph.initializer:
                raw = t.raw_data
                pad = (-offset) % 64  # aligned, as onnx's own writer does
                data.write(b"\0" * pad)
                offset += pad
                data.write(raw)
                t.ClearField("raw_data")
                t.data_location = pb.TensorProto.EXTERNAL
                for key, value in (("location", data_name), ("offset", str(offset)),
                                   ("length", str(len(raw)))):
                    entry = t.external_data.add()
                    entry.key, entry.value = key, value
                offset += len(raw)
    rewrite(src, dst, change)


def with_bad_transpose(model, pb):
    """The first Transpose's perm made invalid ([..., 19]): what the
    onnx_import fuzzer found crashing onnx 1.12's shape inference (the
    importer now rejects it first)."""
    for n in model.graph.node:
        if n.op_type == "Transpose":
            for a in n.attribute:
                if a.name == "perm":
                    a.ints[-1] = 19
            return


def with_negative_dim(model, pb):
    """The first initializer's first dimension made negative."""
    model.graph.initializer[0].dims[0] = -4


def with_missing_input(model, pb):
    """The first MatMul left with one input (the onnx checker rejects it)."""
    for n in model.graph.node:
        if n.op_type == "MatMul":
            del n.input[1:]
            return


def megatron_gpt():
    """The Megatron-shaped GPT the fixtures export (also used by
    bench/onnx_import.py): returns (GPT, causal_attention). Needs torch."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def causal_attention(q, k, v):
        """softmax(q k^T / sqrt(d) + causal mask) v on [b, heads, s, d],
        returned as [b, s, heads * d]."""
        b, a, s, d = q.shape
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return torch.matmul(probs, v).transpose(1, 2).reshape(b, s, a * d)

    class Attention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads, self.head_dim = heads, hidden // heads
            self.linear_qkv = nn.Linear(hidden, 3 * hidden)
            self.linear_proj = nn.Linear(hidden, hidden)

        def forward(self, x):
            b, s, h = x.shape
            qkv = self.linear_qkv(x).view(b, s, self.heads, 3 * self.head_dim)
            q, k, v = torch.split(qkv, self.head_dim, dim=-1)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            return self.linear_proj(causal_attention(q, k, v))

    class Layer(nn.Module):
        def __init__(self, hidden, heads, dropout=0.0):
            super().__init__()
            self.dropout = dropout
            self.input_layernorm = nn.LayerNorm(hidden)
            self.self_attention = Attention(hidden, heads)
            self.pre_mlp_layernorm = nn.LayerNorm(hidden)
            self.linear_fc1 = nn.Linear(hidden, 4 * hidden)
            self.linear_fc2 = nn.Linear(4 * hidden, hidden)

        def forward(self, h):
            a = self.self_attention(self.input_layernorm(h))
            if self.dropout:
                a = F.dropout(a, self.dropout, self.training)
            h = h + a
            m = self.linear_fc2(F.gelu(self.linear_fc1(self.pre_mlp_layernorm(h))))
            if self.dropout:
                m = F.dropout(m, self.dropout, self.training)
            return h + m

    class GPT(nn.Module):
        def __init__(self, vocab, hidden, heads, layers, seq, tied, dropout=0.0):
            super().__init__()
            self.dropout = dropout
            self.word_embeddings = nn.Embedding(vocab, hidden)
            self.position_embeddings = nn.Embedding(seq, hidden)
            self.layers = nn.ModuleList([Layer(hidden, heads, dropout)
                                         for _ in range(layers)])
            self.final_layernorm = nn.LayerNorm(hidden)
            self.output_layer = None if tied else nn.Linear(hidden, vocab, bias=False)
            for m in self.modules():  # Megatron's init (std 0.02, zero bias)
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, 0.0, 0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

        def forward(self, input_ids, labels):
            pos = torch.arange(input_ids.shape[1])
            h = self.word_embeddings(input_ids) + self.position_embeddings(pos)
            if self.dropout:
                h = F.dropout(h, self.dropout, self.training)
            for layer in self.layers:
                h = layer(h)
            h = self.final_layernorm(h)
            w = self.word_embeddings.weight if self.output_layer is None \
                else self.output_layer.weight
            logits = F.linear(h, w)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]),
                                   labels.view(-1), ignore_index=-100)

    return GPT, causal_attention


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", default=os.path.join(HERE, "onnx"))
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("skipped: PyTorch is not installed")
        return 0
    import numpy as np
    import torch.nn as nn
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(HERE, "..", "..", "E2E", "Inputs"))
    from torch_reference import philox_normal, philox_uniform, read_tokens, sample_batch

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear_fc1 = nn.Linear(32, 64)
            self.linear_fc2 = nn.Linear(64, 32)
            self.head = nn.Linear(32, 8)

        def forward(self, features, labels):
            h = F.relu(self.linear_fc2(F.gelu(self.linear_fc1(features))))
            return F.cross_entropy(self.head(h), labels)

    GPT, causal_attention = megatron_gpt()

    def export(model, inputs, names, path):
        torch.onnx.export(model, inputs, path, opset_version=17,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=names,
                          output_names=["loss"])

    def train(model, batches, path, micro=MICRO, global_batch=GLOBAL):
        # tessera-compile's defaults, which are Megatron's: AdamW with
        # weight decay 0.01 on all but biases and 1-D parameters (norms),
        # the gradients clipped to a global norm of 1.0.
        named = list(model.named_parameters())
        decay = [p for n, p in named if p.ndim > 1 and not n.endswith(".bias")]
        no_decay = [p for n, p in named if not (p.ndim > 1 and not n.endswith(".bias"))]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
        with open(path, "w") as f:
            for step in range(1, args.steps + 1):
                opt.zero_grad()
                total = 0.0
                for mb in batches(step):
                    loss = model(*mb) / (global_batch // micro)
                    loss.backward()
                    total += loss.item()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                f.write(json.dumps({"step": step, "loss": total,
                                    "grad_norm": float(norm)}) + "\n")

    # The MLP on tessera-run's synthetic task: label of sample g from
    # uniform(seed, "data.labels", g); features from the "data.centres" and
    # "data.noise" normal streams (runtime/src/Data.cpp).
    def mlp_batches(step):
        out = []
        for m in range(MLP_GLOBAL // MLP_MICRO):
            gs = (np.arange(MLP_MICRO, dtype=np.uint64) +
                  np.uint64((step - 1) * MLP_GLOBAL + m * MLP_MICRO))
            u = philox_uniform(SEED, "data.labels", gs)
            labels = np.minimum(np.floor(u * 8).astype(np.int64), 7)
            scale = 2.0 / math.sqrt(32)
            j = np.arange(32, dtype=np.uint64)
            feats = np.stack([
                (scale * philox_normal(SEED, "data.centres", np.uint64(int(l) * 32) + j)
                 + philox_normal(SEED, "data.noise", g * np.uint64(32) + j)).astype(np.float32)
                for g, l in zip(gs, labels)])
            out.append((torch.from_numpy(feats), torch.from_numpy(labels)))
        return out

    mlp = MLP()
    example = mlp_batches(1)[0]
    export(mlp, example, ["features", "labels"], os.path.join(args.out, "mlp.onnx"))
    train(mlp, mlp_batches, os.path.join(args.out, "mlp.torch.jsonl"),
          MLP_MICRO, MLP_GLOBAL)

    stream = read_tokens(args.data)
    seq = 16

    def gpt_batches(step):
        out = []
        for m in range(GLOBAL // MICRO):
            gs = [(step - 1) * GLOBAL + m * MICRO + i for i in range(MICRO)]
            tokens, labels = sample_batch(stream, seq, gs)  # [S, B]
            out.append((torch.from_numpy(np.ascontiguousarray(tokens.T)),
                        torch.from_numpy(np.ascontiguousarray(labels.T))))
        return out

    class SeparateAttention(nn.Module):
        """Attention with separate q, k and v projections (q_proj, k_proj,
        v_proj, o_proj, as in LLaMA-style modules)."""
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads, self.head_dim = heads, hidden // heads
            self.q_proj = nn.Linear(hidden, hidden)
            self.k_proj = nn.Linear(hidden, hidden)
            self.v_proj = nn.Linear(hidden, hidden)
            self.o_proj = nn.Linear(hidden, hidden)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = (p(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
            return self.o_proj(causal_attention(q, k, v))

    class Logits(nn.Module):
        """The GPT exported forward-only: input_ids -> logits [b, s, vocab]."""
        def __init__(self, gpt):
            super().__init__()
            self.gpt = gpt

        def forward(self, input_ids):
            g = self.gpt
            pos = torch.arange(input_ids.shape[1])
            h = g.word_embeddings(input_ids) + g.position_embeddings(pos)
            for layer in g.layers:
                h = layer(h)
            return g.output_layer(g.final_layernorm(h))

    for name, tied in (("gpt", False), ("gpt-tied", True)):
        gpt = GPT(260, 32, 4, 2, seq, tied)
        export(gpt, gpt_batches(1)[0], ["input_ids", "labels"],
               os.path.join(args.out, name + ".onnx"))
        if not tied:  # same weights: its reference is gpt.torch.jsonl
            torch.onnx.export(Logits(gpt), (gpt_batches(1)[0][0],),
                              os.path.join(args.out, "gpt-logits.onnx"),
                              opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False,
                              input_names=["input_ids"], output_names=["logits"])
        if not tied:  # dynamic batch axis: the same model, any batch
            torch.onnx.export(gpt, gpt_batches(1)[0],
                              os.path.join(args.out, "gpt-dynamic.onnx"),
                              opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False,
                              input_names=["input_ids", "labels"],
                              output_names=["loss"],
                              dynamic_axes={"input_ids": {0: "batch"},
                                            "labels": {0: "batch"}})
        train(gpt, gpt_batches, os.path.join(args.out, name + ".torch.jsonl"))

    # GPT-2 in Hugging Face's layout (its modules re-written here, so that no
    # transformers install is needed): Conv1D weights stored [in, out]
    # (torch.addmm on the flattened tokens), the QKV projection's output laid
    # out as [q][k][v] blocks and split, the causal mask a tril buffer sliced
    # and applied with torch.where(mask, scores, finfo.min), scores divided
    # by a torch.full scalar, gelu_new (the tanh GELU), positions from
    # arange, LM head tied to wte;
    # exported forward-only (logits), trained with the token cross-entropy.
    class Conv1D(nn.Module):
        def __init__(self, nf, nx):
            super().__init__()
            self.nf = nf
            self.weight = nn.Parameter(torch.empty(nx, nf))
            self.bias = nn.Parameter(torch.zeros(nf))
            nn.init.normal_(self.weight, std=0.02)

        def forward(self, x):
            size_out = x.size()[:-1] + (self.nf,)
            x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
            return x.view(size_out)

    class GPT2Attention(nn.Module):
        def __init__(self, hidden, heads, positions):
            super().__init__()
            self.heads, self.head_dim, self.hidden = heads, hidden // heads, hidden
            self.register_buffer("bias", torch.tril(torch.ones(
                (positions, positions), dtype=torch.bool)).view(1, 1, positions, positions),
                persistent=False)
            self.c_attn = Conv1D(3 * hidden, hidden)
            self.c_proj = Conv1D(hidden, hidden)

        def split_heads(self, t):
            return t.view(t.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

        def forward(self, h):
            q, k, v = self.c_attn(h).split(self.hidden, dim=2)
            q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
            w = torch.matmul(q, k.transpose(-1, -2))
            w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)
            s = q.size(-2)
            causal = self.bias[:, :, :s, :s]
            w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
            w = torch.softmax(w, dim=-1)
            o = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
            return self.c_proj(o.view(o.size()[:-2] + (self.hidden,)))

    class GPT2MLP(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.c_fc = Conv1D(4 * hidden, hidden)
            self.c_proj = Conv1D(hidden, 4 * hidden)

        def forward(self, h):
            # gelu_new, GPT-2's activation (Hugging Face's NewGELUActivation).
            u = self.c_fc(h)
            a = 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) *
                                            (u + 0.044715 * torch.pow(u, 3.0))))
            return self.c_proj(a)

    class GPT2Block(nn.Module):
        def __init__(self, hidden, heads, positions):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden)
            self.attn = GPT2Attention(hidden, heads, positions)
            self.ln_2 = nn.LayerNorm(hidden)
            self.mlp = GPT2MLP(hidden)

        def forward(self, h):
            h = h + self.attn(self.ln_1(h))
            return h + self.mlp(self.ln_2(h))

    class GPT2Model(nn.Module):
        def __init__(self, vocab, hidden, heads, layers, positions):
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(positions, hidden)
            self.h = nn.ModuleList([GPT2Block(hidden, heads, positions) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(hidden)
            nn.init.normal_(self.wte.weight, std=0.02)
            nn.init.normal_(self.wpe.weight, std=0.01)

    class GPT2LMHeadModel(nn.Module):
        def __init__(self, vocab, hidden, heads, layers, positions):
            super().__init__()
            self.transformer = GPT2Model(vocab, hidden, heads, layers, positions)

        def forward(self, input_ids):
            t = self.transformer
            pos = torch.arange(0, input_ids.size(-1), dtype=torch.long).unsqueeze(0)
            h = t.wte(input_ids) + t.wpe(pos)
            for block in t.h:
                h = block(h)
            return F.linear(t.ln_f(h), t.wte.weight)

    class WithLoss(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, labels):
            logits = self.model(input_ids)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))

    gpt2 = GPT2LMHeadModel(260, 32, 4, 2, seq)
    torch.onnx.export(gpt2, (gpt_batches(1)[0][0],), os.path.join(args.out, "gpt2-hf.onnx"),
                      opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["input_ids"],
                      output_names=["logits"])
    train(WithLoss(gpt2), gpt_batches, os.path.join(args.out, "gpt2-hf.torch.jsonl"))

    to_external_data(os.path.join(args.out, "gpt.onnx"),
                     os.path.join(args.out, "gpt-ext.onnx"))

    # The same GPT with separate q, k and v projections.
    sep = GPT(260, 32, 4, 2, seq, False)
    for layer in sep.layers:
        layer.self_attention = SeparateAttention(32, 4)
        for m in layer.self_attention.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                nn.init.zeros_(m.bias)
    export(sep, gpt_batches(1)[0], ["input_ids", "labels"],
           os.path.join(args.out, "gpt-sep-qkv.onnx"))
    train(sep, gpt_batches, os.path.join(args.out, "gpt-sep-qkv.torch.jsonl"))

    # The GPT with Megatron's hidden dropout (0.1 after the embedding and
    # both residual branches): no PyTorch reference (the masks differ), the
    # parity test compares Tessera's layouts with each other.
    drop = GPT(260, 32, 4, 2, seq, False, dropout=0.1)
    export(drop, gpt_batches(1)[0], ["input_ids", "labels"],
           os.path.join(args.out, "gpt-dropout.onnx"))

    # Models the importer must reject, each with a clear error.
    class Tiny(nn.Module):
        def __init__(self, act="gelu", shared=False):
            super().__init__()
            self.act, self.shared = act, shared
            self.fc1 = nn.Linear(4, 4)
            self.fc2 = nn.Linear(4, 4)

        def forward(self, features, labels):
            h = self.fc1(features)
            if self.act == "sigmoid":
                h = torch.sigmoid(h)
            elif self.act == "softmax":
                h = torch.softmax(h, dim=-1)
            elif self.act == "silu":
                h = F.silu(h)
            elif self.act == "dropout":
                h = F.dropout(F.gelu(h), 0.1, self.training)
            else:
                h = F.gelu(h)
            w = self.fc1.weight if self.shared else self.fc2.weight
            return F.cross_entropy(F.linear(h, w, self.fc2.bias), labels)

    example = (torch.randn(2, 4), torch.tensor([0, 3]))
    bad = os.path.join(args.out, "bad")
    os.makedirs(bad, exist_ok=True)
    export(Tiny("sigmoid"), example, ["features", "labels"], os.path.join(bad, "unsupported-op.onnx"))
    export(Tiny("softmax"), example, ["features", "labels"], os.path.join(bad, "outside-pattern.onnx"))
    export(Tiny(shared=True), example, ["features", "labels"], os.path.join(bad, "shared-weight.onnx"))
    torch.onnx.export(Tiny(), example, os.path.join(bad, "opset13.onnx"), opset_version=13,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["features", "labels"])
    export(Tiny("dropout"), example, ["features", "labels"], os.path.join(bad, "mlp-dropout.onnx"))
    class Linear3d(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).mean()

    export(Linear3d(), (torch.randn(2, 3, 4),), ["features"],
           os.path.join(bad, "transpose-3d.onnx"))
    linear3d = os.path.join(bad, "transpose-3d.onnx")
    rewrite(linear3d, os.path.join(bad, "transpose-perm.onnx"), with_bad_transpose)
    rewrite(linear3d, os.path.join(bad, "negative-dim.onnx"), with_negative_dim)
    rewrite(linear3d, os.path.join(bad, "missing-input.onnx"), with_missing_input)
    os.remove(linear3d)
    torch.onnx.register_custom_op_symbolic(
        "aten::silu", lambda g, x: g.op("tessera_test::Swish", x), 17)
    export(Tiny("silu"), example, ["features", "labels"], os.path.join(bad, "custom-domain.onnx"))
    print("wrote", ", ".join(sorted(os.listdir(args.out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
