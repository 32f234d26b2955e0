# make repro-deft [FAST=1]: DEFT (ICPP'23) — selection time of Top-k vs DEFT as P grows,
# gradient build-up (actual density / target) of Top-k vs DEFT, loss curves.
# Outputs in data/out/deft/.
repro-deft: build
	@bash pipelines/deft.sh
