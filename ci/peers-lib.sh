# Shared by ci/build-peers.sh and ci/build-peers-machete.sh (sourced, not run): copying a vLLM
# source into .peers/ once per origin, and the torch-free STD_TORCH_CHECK both builds compile with.

# copy_vllm_sources TAG VLLM_SRC SRC_OUT PATH...: the PATHs of a vLLM tree, bare git dir ($VLLM_REV
# or HEAD) or sdist .tar.gz copied into SRC_OUT, skipped when SRC_OUT/SOURCE names the same origin.
# Sets $origin and $digest (sha256 of the copied LICENSE and csrc files) and prints both.
copy_vllm_sources() {
  local tag=$1 src=$2 out=$3 kind top p
  shift 3
  local needed=("$@")
  if [ -d "$src/csrc" ]; then
    kind=tree
    if [ -f "$src/PKG-INFO" ]; then
      origin="sdist $(sed -n 's/^Version: //p' "$src/PKG-INFO" | head -1)"
    elif [ -e "$src/.git" ]; then
      origin="git $(git -C "$src" rev-parse HEAD)"
    else
      origin="tree $(cd "$src" && pwd)"
    fi
  elif git --git-dir="$src" rev-parse "${VLLM_REV:-HEAD}" >/dev/null 2>&1; then
    kind=git
    origin="git $(git --git-dir="$src" rev-parse "${VLLM_REV:-HEAD}")"
  elif [ -f "$src" ] && [[ "$src" == *.tar.gz ]]; then
    kind=tar
    origin="sdist $(basename "$src" .tar.gz | sed 's/^vllm-//')"
  else
    echo "$tag: $src is neither a vLLM tree, a git dir nor an sdist" >&2
    exit 2
  fi
  if [ "$(realpath "$src")" = "$(realpath -m "$out")" ]; then
    origin=$(cat "$out/SOURCE" 2>/dev/null || echo "$origin")  # rebuilding from the extracted copy
  elif [ "$(cat "$out/SOURCE" 2>/dev/null)" != "$origin" ]; then
    rm -rf "$out"
    mkdir -p "$out"
    case $kind in
      tree) for p in "${needed[@]}"; do mkdir -p "$out/$(dirname "$p")"; cp -r "$src/$p" "$out/$p"; done ;;
      git) git --git-dir="$src" archive "${origin#git }" "${needed[@]}" | tar -x -C "$out" ;;
      tar)
        top=$(tar -tzf "$src" | awk -F/ 'NR == 1 {print $1}')  # awk reads to the end: no SIGPIPE
        tar -xzf "$src" -C "$out" --strip-components=1 "${needed[@]/#/$top/}"
        ;;
    esac
    echo "$origin" >"$out/SOURCE"
  fi
  digest=$(cd "$out" && find LICENSE csrc -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
  echo "$tag: vLLM source: $origin (sources sha256 $digest)"
}

# write_check_shim SHIM API: SHIM/torch/headeronly/util/Exception.h, STD_TORCH_CHECK without torch.
# Host failures throw (the API named API catches them and reports through its last_error); device
# code traps.
write_check_shim() {
  mkdir -p "$1/torch/headeronly/util"
  {
    echo "// quantrt peer shim: STD_TORCH_CHECK without torch. Host failures throw (the C API catches"
    echo "// them and reports through ${2}_last_error); device code traps."
    cat <<'EOF_SHIM'
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace quantrt_peer {
template <typename... Args>
__host__ __device__ inline void check_failed(const char* cond, const char* file, int line,
                                             const Args&... args) {
#ifdef __CUDA_ARCH__
  __trap();
#else
  std::ostringstream os;
  os << file << ":" << line << ": check failed: " << cond;
  if (sizeof...(args)) os << ": ";
  (void)(os << ... << args);
  throw std::runtime_error(os.str());
#endif
}
}  // namespace quantrt_peer

#define STD_TORCH_CHECK(cond, ...)                                                       \
  do {                                                                                   \
    if (!(cond)) ::quantrt_peer::check_failed(#cond, __FILE__, __LINE__, ##__VA_ARGS__); \
  } while (0)
#define STD_TORCH_CHECK_NOT_IMPLEMENTED(cond, ...) STD_TORCH_CHECK(cond, ##__VA_ARGS__)
EOF_SHIM
  } >"$1/torch/headeronly/util/Exception.h"
}
