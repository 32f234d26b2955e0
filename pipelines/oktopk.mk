# make repro-oktopk [FAST=1]: Ok-Topk (PPoPP'22) — Table 1 measured vs formulas, threshold-reuse
# count deviation (Fig. 6), balanced vs naive regions (Fig. 7), time breakdown and projection
# (Figs. 8-12), accuracy vs dense (Figs. 9, 11). Outputs in data/out/oktopk/; then the issue-16
# figures (pipelines/oktopk-figs.sh: Fig. 6 on real gradients, Fig. 5 ξ, Fig. 7b balancing that
# fires, Table 1 end to end) in data/out/oktopk-figs/ and docs/results/oktopk-figs.md.
repro-oktopk: build deps-py
	@bash pipelines/oktopk.sh

# make repro-oktopk-figs [FAST=1]: the issue-16 figures alone (no build: uses target/release).
.PHONY: repro-oktopk-figs
repro-oktopk-figs: deps-py
	@bash pipelines/oktopk-figs.sh
