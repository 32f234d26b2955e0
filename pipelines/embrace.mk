# make repro-embrace [FAST=1]: EmbRace — bytes per rank of AlltoAll vs AllGather vs dense for
# Zipf embedding gradients at P = 2…8, the AlltoAll/AllGather crossover, and training with the
# sharded embedding equal to dense. Outputs in data/out/embrace/.
repro-embrace: build
	@bash pipelines/embrace.sh
