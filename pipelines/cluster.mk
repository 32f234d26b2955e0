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

# make repro-cluster [FAST=1] [PARTS=…]: at 100 Mbit/s and 1 Gbit/s on 4 hosts, (1) the α-β fit
# of the ring at P = 2, 4, 8; (2) the step split compute / selection / communication of dense
# (ring, plus MPI_Allreduce by bench), TopkA, TopkDSA, gTopk, Gaussiank, Ok-Topk and DEFT, with
# the model's prediction and time to the dense run's loss; (3) LAMB vs 1-bit LAMB throughput;
# (4) EmbRace vs AllGather vs dense on the LM and its schedule's stall vs fifo. PARTS=embrace
# runs (4) alone. Steps (2)–(5) run REPEATS=3 times interleaved, merged as median (min–max);
# REUSE=1 rewrites the sections from the last run's files. Brings its own cluster up and
# down; needs root (docs/CLUSTER.md).
.PHONY: repro-cluster
repro-cluster: build
	@bash pipelines/cluster-repro.sh
