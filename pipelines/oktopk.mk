# make repro-oktopk [FAST=1]: Ok-Topk (PPoPP'22) — Table 1 measured vs formulas, threshold-reuse
# count deviation (Fig. 6), balanced vs naive regions (Fig. 7), time breakdown and projection
# (Figs. 8-12), accuracy vs dense (Figs. 9, 11). Outputs in data/out/oktopk/.
repro-oktopk: build
	@bash pipelines/oktopk.sh
