# make repro-embrace [FAST=1]: EmbRace — bytes per rank of AlltoAll vs AllGather vs dense for
# Zipf embedding gradients at P = 2…8, the AlltoAll/AllGather crossover, and training with the
# sharded embedding equal to dense. Outputs in data/out/embrace/.
repro-embrace: build
	@bash pipelines/embrace.sh

# make repro-embrace-fig7 [FAST=1]: EmbRace Fig. 7 on the shaped cluster — an embedding-dominated
# LM (lstm-lm, V = 100k, d = 256) on 4 and 8 hosts at 100 Mbit/s and 1 Gbit/s: dense,
# allgather-raw, allgather and embrace (fifo, embrace, 2d), 3 interleaved repeats, step time at
# equal compute beside the paper's 1.02-2.41x. Needs root (docs/CLUSTER.md); outputs in
# data/out/embrace-fig7/.
.PHONY: repro-embrace-fig7
repro-embrace-fig7: build deps-py
	@bash pipelines/embrace-fig7.sh
