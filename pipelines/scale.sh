#!/usr/bin/env bash
# make repro-scale [FAST=1]: the papers' scale, simulated (docs/SIMULATE.md). In-process
# recordings (ranks as threads, --comm-trace) of one step of dense ring, TopkA, TopkDSA,
# gTop-k, Gaussiank and Ok-Topk at P = 16, 32, 64 (FAST: 16), each rank with its own synthetic
# gradient of SIZE and density 2 %, replayed with sizes scaled to VGG-16 (14,728,266
# parameters, Ok-Topk Table 2) on a dragonfly after Piz Daint's Cray Aries (docs/papers/
# oktopk.md §4), communication only; at the largest P, one step of ring and of Ok-Topk replayed
# alone and timed. Writes the docs/RESULTS.md section "sim-scale". PS="16 … 256" picks the
# world sizes; REUSE=1 keeps the recordings and replays already in data/out/scale and only
# rewrites the section.
source "$(dirname "$0")/lib.sh"
out_dir scale
ALGOS=ring,topka,topkdsa,gtopk,gaussiank,oktopk
if [ "$FAST" != 0 ]; then PS="16"; else PS=${PS:-"16 32 64"}; fi
SIZE=1M                   # bytes of f32 gradient per rank recorded
N_REC=262144              # its elements
N_VGG=14728266            # VGG-16's parameters
SCALE=$(python3 -c "print($N_VGG / $N_REC)")
# Cray Aries as one SimGrid dragonfly: 4 nodes per router, 16 routers per chassis, 6 chassis
# per group; every link 10 GB/s, 1 µs (the platform's defaults but the rate and latency).
PLATFORM=(--topology dragonfly --link-rate 10GBps --latency 1us)
T0=$(date +%s)
for p in $PS; do
  [ "$REUSE" != 0 ] && [ -f sim-p$p.csv ] && continue
  /usr/bin/time -f "%e %M" -o rec-p$p.time \
    $B/gradallreduce bench --algo $ALGOS --input topk --sizes $SIZE:$SIZE --warmup 1 --iters 1 \
    --density 0.02 --ranks $p --format csv -q --comm-trace rec-p$p.parquet > bench-p$p.csv
  /usr/bin/time -f "%e %M" -o sim-p$p.time \
    $B/gradreport simulate rec-p$p.parquet "${PLATFORM[@]}" --scale-bytes $SCALE \
    --compute none --format csv -o sim-p$p.parquet > sim-p$p.csv
done
# One recorded step replayed alone at the largest P: ring (step 0) and Ok-Topk (step 5, the
# order of --algo).
PMAX=${PS##* }
for s in 0 5; do
  [ "$REUSE" != 0 ] && [ -f one-p$PMAX-$s.time ] && continue
  /usr/bin/time -f "%e %M" -o one-p$PMAX-$s.time \
    $B/gradreport simulate rec-p$PMAX.parquet "${PLATFORM[@]}" --scale-bytes $SCALE \
    --compute none --no-phases --steps $s --format csv > one-p$PMAX-$s.csv
done
{
  echo -n "Made by \`make repro-scale$( [ "$FAST" != 0 ] && echo ' FAST=1')\` (pipelines/scale.sh) on $(date -u +%F)"
  if [ "$REUSE" != 0 ]; then echo " (REUSE=1: this text rewritten from the runs' files)."
  else echo "; wall time $(( $(date +%s) - T0 )) s."; fi
  echo
  python3 "$ROOT/pipelines/sim_tables.py" scale --ps "$PS" --scale $SCALE --pmax $PMAX \
    --validation "$ROOT/data/out/sim/section.md"
} > section.md
section sim-scale section.md
cat section.md
