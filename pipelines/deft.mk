# make repro-deft [FAST=1]: DEFT (ICPP'23) — selection time of Top-k vs DEFT as P grows,
# gradient build-up (actual density / target) of Top-k vs DEFT, loss curves.
# Outputs in data/out/deft/; then the issue-16 figures (pipelines/deft-figs.sh: density sweep,
# Fig. 8; error-norm curves, Figs. 5/6) in data/out/deft-figs/ and docs/results/deft-figs.md.
repro-deft: build deps-py
	@bash pipelines/deft.sh

# make repro-deft-figs [FAST=1]: the issue-16 figures alone (no build: uses target/release).
.PHONY: repro-deft-figs
repro-deft-figs: deps-py
	@bash pipelines/deft-figs.sh

# make repro-deft-breakdown [FAST=1]: DEFT Figs. 7 and 9 as a breakdown (selection, norms and
# bin packing, broadcast, communication for topk-union, cltk, deft) and the heap top-k bench
# alone (no build of the tools: uses target/release). SCALE=1 for DEFT's full LSTM; HOSTS=8
# [RATE=1gbit] runs it across shaped hosts (root; docs/CLUSTER.md).
.PHONY: repro-deft-breakdown
repro-deft-breakdown:
	@bash pipelines/deft-breakdown.sh
