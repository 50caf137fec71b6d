#!/usr/bin/env bash
# fuzz/make-seeds.sh OUTDIR [BUILD_DIR]: writes the seed corpora of the fuzz
# targets to OUTDIR/TARGET/ (nothing is committed):
#   - artifact_loader, checkpoint_manifest, checkpoint_shard, dataset_index:
#     BUILD_DIR/bin/tessera-fuzz-seeds (default build-fuzz; fuzz/MakeSeeds.cpp:
#     artifacts from the unit tests' builders, their manifests, shard files,
#     .idx/.bin pairs);
#   - mlir_pipeline: every test/**/*.mlir split at `// -----` (RUN, CHECK and
#     expected-* lines dropped) and examples/mlp.mlir;
#   - onnx_import: the ONNX fixtures of test/Import/Inputs/onnx;
#   - when a compiler build is there (build/bin/tessera-compile and
#     tessera-run, or TESSERA_BUILD=DIR), also the MLP example compiled to
#     a .tsr, a checkpoint of it saved by tessera-run (its manifest.json and
#     shard), and a dataset from tessera-preprocess.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: fuzz/make-seeds.sh OUTDIR [BUILD_DIR]}
mkdir -p "$out"
"${2:-build-fuzz}"/bin/tessera-fuzz-seeds "$out"

mkdir -p "$out/onnx_import"
find test/Import/Inputs/onnx -name '*.onnx' | while read -r f; do
  cp "$f" "$out/onnx_import/$(echo "$f" | tr / _)"
done

mkdir -p "$out/mlir_pipeline"
cp examples/mlp.mlir "$out/mlir_pipeline/example_mlp.mlir"
find test -name '*.mlir' | sort | python3 -c '
import os, re, sys
out = sys.argv[1]
for path in sys.stdin.read().split():
    text = open(path).read()
    for i, part in enumerate(re.split(r"^// -----.*$", text, flags=re.M)):
        lines = [l for l in part.splitlines()
                 if not re.match(r"\s*// *(RUN|CHECK|expected-)", l)]
        body = "\n".join(lines).strip()
        if body:
            name = path.replace("/", "_")[:-5] + "_%d.mlir" % i
            open(os.path.join(out, name), "w").write(body + "\n")
' "$out/mlir_pipeline"

bin=${TESSERA_BUILD:-build}/bin
if [ -x "$bin/tessera-compile" ] && [ -x "$bin/tessera-run" ] &&
   [ -x "$bin/tessera-preprocess" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # The MLP example, on one rank and at tp 2 x dp 2, and a checkpoint of
  # the former (its shard only when small: a large seed slows every exec).
  if "$bin/tessera-compile" examples/mlp.mlir --micro-batch-size 4 \
       -o "$tmp/mlp.tsr" >/dev/null 2>&1; then
    cp "$tmp/mlp.tsr" "$out/artifact_loader/example_mlp.tsr"
    if "$bin/tessera-run" -n 1 "$tmp/mlp.tsr" --steps 2 --save "$tmp/ckpt" \
         >/dev/null 2>&1; then
      m=$(find "$tmp/ckpt" -name manifest.json | head -n 1)
      s=$(find "$tmp/ckpt" -name 'rank_*.bin' -size -1024k | head -n 1)
      if [ -n "$m" ]; then cp "$m" "$out/checkpoint_manifest/example_mlp.json"; fi
      if [ -n "$s" ]; then cp "$s" "$out/checkpoint_shard/example_mlp.bin"; fi
    fi
  fi
  if "$bin/tessera-compile" examples/mlp.mlir --micro-batch-size 4 --tp 2 \
       --dp 2 -o "$tmp/mlp-tp2-dp2.tsr" >/dev/null 2>&1; then
    cp "$tmp/mlp-tp2-dp2.tsr" "$out/artifact_loader/example_mlp_tp2_dp2.tsr"
  fi
  printf '{"text": "hello world, a fuzz seed"}\n{"text": "second document"}\n' > "$tmp/docs.jsonl"
  if "$bin/tessera-preprocess" --input "$tmp/docs.jsonl" \
       --output-prefix "$tmp/ds" >/dev/null 2>&1; then
    idx=$(ls "$tmp"/ds*.idx | head -n 1)
    python3 - "$idx" "${idx%.idx}.bin" "$out/dataset_index/preprocessed.ds" <<'PY'
import struct, sys
idx = open(sys.argv[1], 'rb').read()
data = open(sys.argv[2], 'rb').read()
open(sys.argv[3], 'wb').write(struct.pack('<I', len(idx)) + idx + data)
PY
  fi
fi
for d in "$out"/*/; do
  echo "make-seeds: $(ls "$d" | wc -l) seeds in $d"
done
