# make repro-dense [FAST=1]: the dense allreduces (ring, Rabenseifner, tree, MPI_Allreduce) on
# in-process ranks against the same under mpirun, 3 interleaved repeats, issue 3's goals
# (pipelines/dense.sh; section "dense" of docs/RESULTS.md).
.PHONY: repro-dense
repro-dense: build deps-py
	@bash pipelines/dense.sh
