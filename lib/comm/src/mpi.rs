//! The MPI backend: one rank per process under `mpirun`, on the `mpi` crate (rsmpi) and the
//! system MPI library. Messages are typed MPI messages; a receive probes for the length.

use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

use crate::{Buf, Comm, Kind, Traffic};

/// One rank of an MPI world.
pub struct MpiComm {
    world: SimpleCommunicator,
    traffic: Traffic,
}

impl MpiComm {
    pub(crate) fn new(world: SimpleCommunicator) -> Self {
        MpiComm {
            world,
            traffic: Traffic::default(),
        }
    }
    /// Ends the whole job (every rank) with `code`.
    pub fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}

/// A pending send of any element type (rsmpi types requests by their buffer).
enum AnyReq<'a, S: mpi::request::Scope<'a>> {
    F32(mpi::request::Request<'a, [f32], S>),
    F64(mpi::request::Request<'a, [f64], S>),
    U32(mpi::request::Request<'a, [u32], S>),
    U64(mpi::request::Request<'a, [u64], S>),
    U8(mpi::request::Request<'a, [u8], S>),
}

impl<'a, S: mpi::request::Scope<'a>> AnyReq<'a, S> {
    fn wait(self) {
        match self {
            AnyReq::F32(r) => drop(r.wait()),
            AnyReq::F64(r) => drop(r.wait()),
            AnyReq::U32(r) => drop(r.wait()),
            AnyReq::U64(r) => drop(r.wait()),
            AnyReq::U8(r) => drop(r.wait()),
        }
    }
}

fn tag_of(tag: u32) -> i32 {
    (tag & 0x7fff) as i32
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }
    fn size(&self) -> usize {
        self.world.size() as usize
    }
    fn backend(&self) -> &'static str {
        "mpi"
    }
    fn exchange_raw(
        &self,
        tag: u32,
        sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> Vec<Buf> {
        let t = tag_of(tag);
        let world = &self.world;
        mpi::request::scope(|scope| {
            let mut reqs = Vec::with_capacity(sends.len());
            for (d, b) in &sends {
                let proc = world.process_at_rank(*d as i32);
                let r = match b {
                    Buf::F32(v) => AnyReq::F32(proc.immediate_send_with_tag(scope, &v[..], t)),
                    Buf::F64(v) => AnyReq::F64(proc.immediate_send_with_tag(scope, &v[..], t)),
                    Buf::U32(v) => AnyReq::U32(proc.immediate_send_with_tag(scope, &v[..], t)),
                    Buf::U64(v) => AnyReq::U64(proc.immediate_send_with_tag(scope, &v[..], t)),
                    Buf::U8(v) => AnyReq::U8(proc.immediate_send_with_tag(scope, &v[..], t)),
                };
                reqs.push(r);
            }
            let got: Vec<Buf> = recvs
                .iter()
                .map(|&(s, k)| {
                    let m = world.process_at_rank(s as i32).matched_probe_with_tag(t);
                    match k {
                        Kind::F32 => Buf::F32(m.matched_receive_vec().0),
                        Kind::F64 => Buf::F64(m.matched_receive_vec().0),
                        Kind::U32 => Buf::U32(m.matched_receive_vec().0),
                        Kind::U64 => Buf::U64(m.matched_receive_vec().0),
                        Kind::U8 => Buf::U8(m.matched_receive_vec().0),
                    }
                })
                .collect();
            for r in reqs {
                r.wait();
            }
            got
        })
    }
    fn barrier(&self) {
        self.world.barrier();
    }
    fn allreduce_native_f32(&self, data: &mut [f32]) {
        self.traffic.add_opaque(data.len() * 4);
        if self.size() > 1 {
            let send = data.to_vec();
            self.world
                .all_reduce_into(&send[..], data, mpi::collective::SystemOperation::sum());
        }
    }
    fn allreduce_native_f64(&self, data: &mut [f64]) {
        self.traffic.add_opaque(data.len() * 8);
        if self.size() > 1 {
            let send = data.to_vec();
            self.world
                .all_reduce_into(&send[..], data, mpi::collective::SystemOperation::sum());
        }
    }
    fn traffic(&self) -> &Traffic {
        &self.traffic
    }
}
