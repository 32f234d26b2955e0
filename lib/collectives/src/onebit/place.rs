//! Where a 1-bit state's error buffers live and its local steps run: in host memory over
//! `Kernels`, or resident on a device (`Params::resident`, docs/GPU.md §7) over
//! `DeviceKernels`. The allreduce in the parent module is written once over these steps;
//! only packed signs (1/32 of the data) cross between host and device, besides the
//! gradient going up and the result coming down once per call.

use std::ops::Range;

use gradkit_sparsify::kernels::Kernels;
use gradkit_sparsify::onebit::{settle_errors, settled_sum_sq};
use gradkit_sparsify::resident::{DVec, DeviceKernels};

/// How gathered packed messages decompress into the result.
#[derive(Clone, Copy, Debug)]
pub(super) enum Unpack {
    /// Message k holds the values `k·len..(k+1)·len` (the server chunks; the padding past
    /// the data is not written).
    Chunks(usize),
    /// Every message holds every value: the result is their sum from +0 in message order.
    Sum,
}

impl Unpack {
    /// The values of `data[..n]` message `k` writes (empty past the data).
    fn range(self, k: usize, n: usize) -> Range<usize> {
        match self {
            Unpack::Chunks(len) => (k * len).min(n)..((k + 1) * len).min(n),
            Unpack::Sum => 0..n,
        }
    }
}

/// A state's worker and server error buffers (kept unsettled, see the parent module) and
/// where its steps run.
#[derive(Debug)]
pub(super) enum Place {
    Host {
        kernels: &'static dyn Kernels,
        worker: Vec<f32>,
        server: Vec<f32>,
    },
    Dev {
        dev: &'static dyn DeviceKernels,
        worker: DVec,
        server: DVec,
    },
}

impl Place {
    /// Zero errors of `lens` (worker, server) in host memory, stepped by `kernels`.
    pub fn host(kernels: &'static dyn Kernels, (w, s): (usize, usize)) -> Self {
        Place::Host {
            kernels,
            worker: vec![0.0; w],
            server: vec![0.0; s],
        }
    }

    /// Zero errors of `lens` allocated on `dev` (no transfer).
    pub fn device(dev: &'static dyn DeviceKernels, (w, s): (usize, usize)) -> Self {
        Place::Dev {
            dev,
            worker: dev.zeros(w),
            server: dev.zeros(s),
        }
    }

    /// Lengths of the (worker, server) error buffers.
    pub fn lens(&self) -> (usize, usize) {
        match self {
            Place::Host { worker, server, .. } => (worker.len(), server.len()),
            Place::Dev { worker, server, .. } => (worker.len(), server.len()),
        }
    }

    /// Step 1: the sign bits of `data + worker error` (the error settling `due` while read)
    /// into `bits`; returns the scale. On a device: the data goes up, the bits come down.
    pub fn compress(&mut self, data: &[f32], due: f32, bits: &mut Vec<u8>) -> f32 {
        match self {
            Place::Host {
                kernels, worker, ..
            } => {
                bits.resize(worker.len() / 8, 0);
                kernels.onebit_compress_deferred(data, worker, bits, due)
            }
            Place::Dev { dev, worker, .. } => {
                let x = dev.upload_f32(data);
                let (b, s) = dev.onebit_compress_deferred(&x, worker, due);
                *bits = dev.download_u8(&b);
                s
            }
        }
    }

    /// Step 3: the weighted sum of the chunks `msgs` (each exactly `out.len()` bytes) plus
    /// the server error (settling `due`), its signs into `out`; returns Σz². On a device:
    /// the chunks go up together, the packed result comes down.
    pub fn server(&mut self, msgs: &[(Vec<u8>, f32)], due: f32, out: &mut [u8]) -> f64 {
        match self {
            Place::Host {
                kernels, server, ..
            } => kernels.onebit_server_deferred(msgs, server, due, out),
            Place::Dev { dev, server, .. } => {
                let all: Vec<u8> = msgs.iter().flat_map(|(b, _)| b.iter().copied()).collect();
                let scales: Vec<f32> = msgs.iter().map(|(_, s)| *s).collect();
                let (b, ss) =
                    dev.onebit_server_deferred(&dev.upload_u8(&all), &scales, server, due);
                out.copy_from_slice(&dev.download_u8(&b));
                ss
            }
        }
    }

    /// Step 4: the packed `parts` with their scales into `data`, as `how` lays them out. On
    /// a device: the parts go up together, the result comes down once.
    pub fn decompress(&self, parts: &[(Vec<u8>, f32)], how: Unpack, data: &mut [f32]) {
        let n = data.len();
        match self {
            Place::Host { kernels, .. } => {
                if let Unpack::Sum = how {
                    data.fill(0.0); // the sum starts from +0 (so −0 terms become +0)
                }
                for (k, (b, s)) in parts.iter().enumerate() {
                    let out = &mut data[how.range(k, n)];
                    match how {
                        Unpack::Chunks(_) => kernels.onebit_decompress(b, *s, out),
                        Unpack::Sum => kernels.onebit_decompress_add(b, *s, out),
                    }
                }
            }
            Place::Dev { dev, .. } => {
                let all: Vec<u8> = parts.iter().flat_map(|(b, _)| b.iter().copied()).collect();
                let bits = dev.upload_u8(&all);
                let mut out = dev.zeros(n);
                let mut at = 0;
                for (k, (b, s)) in parts.iter().enumerate() {
                    let add = matches!(how, Unpack::Sum);
                    dev.onebit_unpack(&bits, at, *s, &mut out, how.range(k, n), add);
                    at += b.len();
                }
                data.copy_from_slice(&dev.download_f32(&out));
            }
        }
    }

    /// Σ of the squares of the settled (worker, server) errors, owing `dues`.
    pub fn settled_sum_sq(&self, (wd, sd): (f32, f32)) -> (f64, f64) {
        match self {
            Place::Host { worker, server, .. } => {
                (settled_sum_sq(worker, wd), settled_sum_sq(server, sd))
            }
            Place::Dev {
                dev,
                worker,
                server,
            } => (
                dev.onebit_settled_sum_sq(worker, wd),
                dev.onebit_settled_sum_sq(server, sd),
            ),
        }
    }

    /// The settled (worker, server) errors, owing `dues` (on a device: downloaded).
    pub fn settled(&self, (wd, sd): (f32, f32)) -> (Vec<f32>, Vec<f32>) {
        let (mut w, mut s) = match self {
            Place::Host { worker, server, .. } => (worker.clone(), server.clone()),
            Place::Dev {
                dev,
                worker,
                server,
            } => (dev.download_f32(worker), dev.download_f32(server)),
        };
        settle_errors(&mut w, wd);
        settle_errors(&mut s, sd);
        (w, s)
    }

    /// [`Place::settled`], moved out of host memory without a copy (the place keeps empty
    /// buffers).
    pub fn take_settled(&mut self, (wd, sd): (f32, f32)) -> (Vec<f32>, Vec<f32>) {
        match self {
            Place::Host { worker, server, .. } => {
                settle_errors(worker, wd);
                settle_errors(server, sd);
                (std::mem::take(worker), std::mem::take(server))
            }
            Place::Dev { dev, .. } => {
                let dev = *dev;
                let ws = self.settled((wd, sd));
                *self = Place::device(dev, (0, 0));
                ws
            }
        }
    }

    /// Replaces both errors by settled ones (on a device: uploaded).
    pub fn set(&mut self, w: Vec<f32>, s: Vec<f32>) {
        match self {
            Place::Host { worker, server, .. } => (*worker, *server) = (w, s),
            Place::Dev {
                dev,
                worker,
                server,
            } => (*worker, *server) = (dev.upload_f32(&w), dev.upload_f32(&s)),
        }
    }
}
