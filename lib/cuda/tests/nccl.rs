//! The Comm conformance suite over the NCCL backend, on a GPU node under mpirun
//! (`pipelines/gpu-check.sh`: 2 ranks on the one GPU with NCCL ≥ 2.30 and
//! `NCCL_MULTI_RANK_GPU_ENABLE=1`, else 1 rank). Ignored by default: there is no GPU where
//! `make test` runs. Each rank opens the GPU of its local rank modulo the GPUs there. The
//! same suite runs over MPI first, and the traffic counters of both runs must be equal.

#![cfg(feature = "cuda")]

use gradkit_comm::conformance::{self, Options};
use gradkit_comm::{Comm, World};
use gradkit_cuda::nccl::{local_rank, NcclComm};

#[test]
#[ignore = "needs a GPU and NCCL under mpirun: pipelines/gpu-check.sh runs it"]
fn nccl_conformance_rank_entry() {
    let code = gradkit_core::cli::run(|| {
        let world = World::init(None)?;
        let reps = world.run(|host: &dyn Comm| {
            let opts = Options {
                large_elems: 1 << 20,
            };
            host.traffic().reset();
            conformance::run(host, &opts)?;
            // Bytes and messages (not the seconds).
            let counts = |c: &dyn Comm| {
                let t = c.traffic().total();
                (t.bytes_sent, t.bytes_recv, t.msgs_sent, t.msgs_recv)
            };
            let mpi = counts(host);
            let gpus = gradkit_cuda::probe()?.count() as u32;
            let nccl = NcclComm::over(host, local_rank() % gpus.max(1))?;
            let rep = conformance::run(&nccl, &opts)?;
            let mine = counts(&nccl);
            anyhow::ensure!(
                mine == mpi,
                "rank {}: traffic over NCCL {mine:?} differs from MPI's {mpi:?} (bytes sent, received, messages sent, received)",
                host.rank()
            );
            Ok(rep)
        })?;
        if world.is_io_rank() {
            println!(
                "| nccl | {} ranks | {} checks passed, traffic equal to MPI's | {} skipped |",
                world.size(),
                reps[0].checks.len(),
                reps[0].skipped.len()
            );
        }
        Ok(())
    });
    assert_eq!(code, std::process::ExitCode::SUCCESS);
}
