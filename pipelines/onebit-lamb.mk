# make repro-onebit-lamb [FAST=1]: 1-bit LAMB — bytes over the run vs LAMB (measured, and the
# paper's 1/(w + (1−w)/16) at our warm-up fraction, 32 for our fp32 buffers) and loss curves
# of LAMB, 1-bit LAMB and 1-bit Adam. Outputs in data/out/onebit-lamb/.
repro-onebit-lamb: build
	@bash pipelines/onebit-lamb.sh
