# make repro-oktopk-closed [FAST=1]: Ok-Topk Figs. 5-6 in closed loop — gradtrain --exchange oktopk
# after a 5 % dense warm-up, the CNN on digits and the LSTM LM, each --adjust policy, count
# deviation of the local and global selections and ξ (--xi) per step. Outputs in
# data/out/oktopk-closed/; full runs also docs/results/oktopk-closed.md.
# make repro-onebit-table3 [FAST=1]: 1-bit LAMB Table 3 and Figs. 1-3 over 3 seeds — LAMB, 1-bit
# LAMB, the basic ablation and DeepSpeed's exact update on a transformer LM. Outputs in
# data/out/onebit-table3/; full runs also docs/results/onebit-table3.md.
.PHONY: repro-oktopk-closed repro-onebit-table3
repro-oktopk-closed: build deps-py
	@bash pipelines/oktopk-closed.sh
repro-onebit-table3: build deps-py
	@bash pipelines/onebit-table3.sh
