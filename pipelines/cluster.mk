# A cluster on one machine (docs/CLUSTER.md): N hosts as network namespaces on a private bridge,
# links shaped with tc to RATE both ways; `make repro-* GRADKIT_CLUSTER=1` then runs the
# pipelines' multi-rank steps across them under mpirun over TCP.
#   make cluster-up HOSTS=4 RATE=1gbit   ·   make cluster-status   ·   make cluster-down
HOSTS ?= 4
RATE ?= 1gbit
.PHONY: cluster-up cluster-down cluster-status
cluster-up:
	@bash pipelines/cluster.sh up --hosts $(HOSTS) --rate $(RATE)
cluster-down:
	@bash pipelines/cluster.sh down
cluster-status:
	@bash pipelines/cluster.sh status

# make repro-cluster [FAST=1]: the α-β fit on the cluster and the training step split, dense
# vs Ok-Topk, at two link rates (brings its own cluster up and down; needs root).
.PHONY: repro-cluster
repro-cluster: build
	@bash pipelines/cluster-repro.sh
