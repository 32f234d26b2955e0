//! The probe with the `cuda` feature, without a GPU: on this machine's own libraries (the
//! loader's cache is the oracle for what must be found), and on stand-in libraries (a driver
//! exporting nothing, one with no GPU, one with two) loaded by a child process. Every outcome
//! must be an error value or the GPUs' names — never a panic, never a line on stderr.

#![cfg(feature = "cuda")]

#[path = "support/stub.rs"]
mod stub;

use std::process::Command;

use gradkit_cuda::{kernels_for, probe, probe_nccl, Device, DeviceError, Library};
use stub::Driver;

const CHILD: &str = "GRADKIT_CUDA_PROBE_CHILD";

/// What the child prints: the probe, the kernels for cuda:0 and cuda:2, and the NCCL probe.
fn report() -> String {
    let show = |r: Result<String, DeviceError>| match r {
        Ok(s) => format!("ok {s}"),
        Err(e) => format!("err {e:?}"),
    };
    [
        show(probe().map(|i| i.to_string())),
        show(kernels_for(Device::Cuda(0)).map(|k| k.name().to_string())),
        show(kernels_for(Device::Cuda(2)).map(|k| k.name().to_string())),
        show(probe_nccl().map(|()| "nccl".to_string())),
    ]
    .join("\n")
}

/// Not a test: the body the tests below run in a child process (with `LD_LIBRARY_PATH` set
/// before the loader starts).
#[test]
#[ignore = "helper: the tests below run it in a child process"]
fn child_report() {
    if std::env::var_os(CHILD).is_some() {
        println!("<<<\n{}\n>>>", report());
    }
}

/// Runs [`child_report`] with `LD_LIBRARY_PATH=dir`: its four lines. The child must exit 0
/// and write nothing on stderr (no panic message).
fn child(dir: &std::path::Path) -> Vec<String> {
    let o = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_report",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "child failed: {out}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    let body = out
        .split("<<<\n")
        .nth(1)
        .and_then(|s| s.split("\n>>>").next())
        .unwrap_or_else(|| panic!("no report in: {out}"));
    body.lines().map(str::to_string).collect()
}

#[test]
fn this_machine_gives_the_answer_its_loader_implies() {
    let has_driver = stub::system_has("libcuda.so");
    let has_nvrtc = stub::system_has("libnvrtc.so");
    match probe() {
        Err(DeviceError::Missing(Library::Driver)) => assert!(
            !has_driver,
            "the loader finds libcuda but the probe does not"
        ),
        Err(DeviceError::Missing(Library::Nvrtc)) => {
            assert!(has_driver && !has_nvrtc, "nvrtc reported missing wrongly")
        }
        other => assert!(
            has_driver && has_nvrtc,
            "no libcuda/libnvrtc for the loader, yet the probe answered {other:?}"
        ),
    }
    if !has_driver {
        let e = kernels_for(Device::Cuda(0)).unwrap_err();
        assert_eq!(e, DeviceError::Missing(Library::Driver));
        assert!(e
            .to_string()
            .starts_with("no CUDA driver found (libcuda.so)"));
    }
    assert_eq!(
        probe_nccl().is_ok(),
        stub::system_has("libnccl.so"),
        "{:?}",
        probe_nccl()
    );
    // The CPU needs nothing.
    assert_eq!(kernels_for(Device::Cpu).unwrap().name(), "cpu");
}

#[test]
fn a_driver_without_its_functions_is_an_error_not_a_panic() {
    let dir_dir = stub::libs("empty", Some(Driver::Empty), true, false);
    let dir = dir_dir.path().to_path_buf();
    let r = child(&dir);
    assert!(
        r[0].starts_with("err Driver(\"Missing symbol cuInit"),
        "{r:?}"
    );
    assert_eq!(r[0].replace("err ", ""), r[1].replace("err ", ""), "{r:?}");
}

#[test]
fn a_driver_with_no_gpu_says_so() {
    let dir_dir = stub::libs("nodevice", Some(Driver::NoDevice), true, false);
    let dir = dir_dir.path().to_path_buf();
    let r = child(&dir);
    assert_eq!(r[0], "err NoDevices", "{r:?}");
    assert_eq!(r[1], "err NoDevices", "{r:?}");
}

#[test]
fn with_gpus_the_probe_names_them_and_opening_a_stand_in_is_one_error() {
    let dir_dir = stub::libs("two", Some(Driver::Gpus(2)), true, true);
    let dir = dir_dir.path().to_path_buf();
    let r = child(&dir);
    // The stand-in driver has no context functions: opening the GPU for the kernels fails
    // (cudarc's panic, caught) and names the GPU.
    assert_eq!(
        r,
        [
            "ok CUDA driver 13.0, 2 GPU(s): cuda:0 Stub GPU 0, cuda:1 Stub GPU 1",
            "err Open(\"cuda:0 (Stub GPU 0): Missing symbol cuDevicePrimaryCtxRetain: dlsym failed\")",
            "err NoSuchDevice { ordinal: 2, count: 2 }",
            "ok nccl",
        ]
    );
}

#[test]
fn nvrtc_is_required_beside_the_driver() {
    let dir_dir = stub::libs("no-nvrtc", Some(Driver::Gpus(1)), false, false);
    let dir = dir_dir.path().to_path_buf();
    let r = child(&dir);
    if stub::system_has("libnvrtc.so") {
        // The loader finds the system's NVRTC beside the stand-in driver.
        assert!(r[0].starts_with("ok CUDA driver 13.0, 1 GPU(s)"), "{r:?}");
    } else {
        assert_eq!(r[0], "err Missing(Nvrtc)", "{r:?}");
    }
}
