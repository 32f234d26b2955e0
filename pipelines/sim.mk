## make repro-sim [FAST=1]: SimGrid's replay calibrated and validated against the shaped
## cluster (pipelines/sim.sh; root, docs/SIMULATE.md). make repro-scale: recordings at
## P = 16…256 in-process replayed on platforms after the papers' clusters (pipelines/scale.sh).
.PHONY: repro-sim repro-scale
repro-sim: build
	@bash pipelines/sim.sh
repro-scale: build
	@bash pipelines/scale.sh
