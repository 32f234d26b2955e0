//! The Comm-level collectives against what each rank must end up with, on Local ranks.

use gradkit_comm::{run_local, Comm, CommExt};

fn block(r: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| (r * 1000 + i) as u32).collect()
}

#[test]
fn allgatherv_alltoallv_broadcast_for_many_p() {
    for p in 1..=8usize {
        let res = run_local(p, |c: &dyn Comm| {
            let r = c.rank();
            let g = c.allgatherv(block(r, r + 1))?;
            for (q, b) in g.iter().enumerate() {
                assert_eq!(b, &block(q, q + 1));
            }
            let sends: Vec<Vec<u32>> = (0..c.size())
                .map(|d| vec![(r * 10 + d) as u32; d + r])
                .collect();
            let got = c.alltoallv(sends)?;
            for (s, b) in got.iter().enumerate() {
                assert_eq!(b, &vec![(s * 10 + r) as u32; r + s]);
            }
            for root in 0..c.size() {
                let b = c.broadcast(root, (r == root).then(|| vec![root as f32, 2.5]))?;
                assert_eq!(b, vec![root as f32, 2.5]);
            }
            let mut x: Vec<f32> = (0..37).map(|i| (i * (r + 1)) as f32).collect();
            c.allreduce_native_f32(&mut x)?;
            let tri = (c.size() * (c.size() + 1) / 2) as f32;
            for (i, v) in x.iter().enumerate() {
                assert_eq!(*v, i as f32 * tri);
            }
            c.barrier()?;
            Ok(c.traffic().total())
        })
        .unwrap();
        // allgatherv: rank r sends every block except rank r+1's, receives all but its own.
        for (r, t) in res.iter().enumerate() {
            let total: u64 = (0..p).map(|q| (q as u64 + 1) * 4).sum();
            if p > 1 {
                let ag_sent = total - ((r + 1) % p + 1) as u64 * 4;
                let ag_recv = total - (r as u64 + 1) * 4;
                let a2a_sent: u64 = (0..p).filter(|&d| d != r).map(|d| (d + r) as u64 * 4).sum();
                assert!(t.bytes_sent >= ag_sent + a2a_sent, "p={p} r={r}");
                assert!(t.bytes_recv >= ag_recv);
            }
        }
    }
}

#[test]
fn a_failing_rank_stops_the_others() {
    let r = run_local(4, |c: &dyn Comm| {
        if c.rank() == 2 {
            anyhow::bail!("rank two gives up");
        }
        // Would wait forever for rank 2 without failure propagation; returns an error.
        let got = c.recv::<f32>(2);
        assert_eq!(got, Err(gradkit_comm::CommError::PeerFailed));
        got?;
        Ok(())
    });
    let e = r.unwrap_err().to_string();
    assert!(e.contains("rank two gives up"), "{e}");
    // A rank that swallows the error still gets errors, never a hang, and the run fails.
    let r = run_local(3, |c: &dyn Comm| {
        if c.rank() == 0 {
            anyhow::bail!("rank zero gives up");
        }
        assert!(c.barrier().is_err());
        assert!(c.recv::<u8>(0).is_err());
        let mut x = [1.0f64; 4];
        assert!(c.allreduce_native_f64(&mut x).is_err());
        Ok(())
    });
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.contains("rank zero gives up"), "{e}");
}
