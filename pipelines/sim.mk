## make repro-sim [FAST=1]: SimGrid's replay calibrated and validated against the shaped
## cluster (pipelines/sim.sh; root, docs/SIMULATE.md). make repro-scale: recordings at
## P = 16…256 in-process replayed on platforms after the papers' clusters (pipelines/scale.sh:
## Ok-Topk and its baselines; pipelines/scale-papers.sh: DEFT, 1-bit LAMB, EmbRace, Ok-Topk's
## weak scaling; pipelines/scale-sizes.sh, `sizes`: a small recording scaled to the model's size
## against one made at that size). SCALE_PARTS="okt deft …" runs some of them.
.PHONY: repro-sim repro-scale repro-expand predict
repro-sim: build
	@bash pipelines/sim.sh
SCALE_PARTS ?= okt deft onebit embrace weak sizes
repro-scale: build
	@if echo " $(SCALE_PARTS) " | grep -q " okt "; then bash pipelines/scale.sh; fi
	@if echo " $(SCALE_PARTS) " | grep -q " sizes "; then bash pipelines/scale-sizes.sh; fi
	@parts=$$(echo " $(SCALE_PARTS) " | sed 's/ okt / /; s/ sizes / /'); \
	  if [ -n "$${parts// /}" ]; then PARTS="$$parts" bash pipelines/scale-papers.sh; fi
## make repro-expand [FAST=1]: gradtrace expand against real recordings of more ranks
## (pipelines/expand-check.sh): docs/RESULTS.md § expand-check.
repro-expand: build
	@bash pipelines/expand-check.sh
## make predict TRACE=rec.parquet [P="64 256"] [ALGOS=…] [PLATFORM="…"] [SCALE=…] [PROFILE=step.csv]:
## a recording of a few ranks to a table at P ranks, whole steps and error bars
## (pipelines/predict.sh, docs/SIMULATE.md § Predict).
predict: build
	@bash pipelines/predict.sh
