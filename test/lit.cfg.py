# -*- Python -*-
import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "Tessera"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs", "gpu", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "trace.test.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.tessera_obj_root, "test")

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.tessera_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
# Ranks share two cores: one BLAS thread each keeps runs predictable.
config.environment["OPENBLAS_NUM_THREADS"] = "1"
# OPENBLAS_CORETYPE passes through so that the suite can run on the
# OpenBLAS kernels of other CPUs (AVX2, AVX-512, another vendor): the
# bounds must hold on all of them.
for var in ["HOME", "TMPDIR", "OPENBLAS_CORETYPE"]:
    if var in os.environ:
        config.environment[var] = os.environ[var]

config.substitutions.append(("%examples", os.path.join(config.tessera_src_root, "examples")))
config.substitutions.append(("%python", "python3"))

tools = ["tessera-opt", "tessera-compile", "tessera-run", "tessera-gen", "tessera-preprocess", "tessera-export",
         "tessera-translate"]
llvm_config.add_tool_substitutions(tools, [config.tessera_tools_dir])

# Numerical checks against PyTorch where Debian's python3-torch is installed
# (not installed by scripts/install-deps.sh: ~190 MB of packages).
import subprocess
torch_python = "/usr/bin/python3"
try:
    if subprocess.run([torch_python, "-c", "import torch"], capture_output=True,
                      timeout=120).returncode == 0:
        config.available_features.add("torch")
except (OSError, subprocess.TimeoutExpired):
    pass
config.substitutions.append(("%torch_python", torch_python))

# Checks against Hugging Face transformers (PyTorch 2) in the project's
# environment, .venv (scripts/install-python.sh, which scripts/check.sh
# runs).
hf_python = os.path.join(config.tessera_src_root, ".venv", "bin", "python")
try:
    if os.path.exists(hf_python) and subprocess.run(
            [hf_python, "-c", "import torch, transformers, safetensors"],
            capture_output=True, timeout=300).returncode == 0:
        config.available_features.add("transformers")
    # onnxruntime, for the ONNX models tessera-export writes.
    if os.path.exists(hf_python) and subprocess.run(
            [hf_python, "-c", "import onnxruntime"],
            capture_output=True, timeout=300).returncode == 0:
        config.available_features.add("onnxruntime")
except (OSError, subprocess.TimeoutExpired):
    pass
config.substitutions.append(("%hf_python", hf_python))

# The CUDA backend plugin was built (TESSERA_ENABLE_CUDA); tests that need a
# GPU to run on are ctests labelled "gpu" (they report Skipped without one),
# but "gpu" is also a lit feature for checks that differ with a device.
if os.path.exists(os.path.join(config.tessera_obj_root, "lib", "libTesseraBackend_cuda.so")):
    config.available_features.add("cuda-backend")
if os.path.exists("/dev/nvidiactl"):
    config.available_features.add("gpu")
