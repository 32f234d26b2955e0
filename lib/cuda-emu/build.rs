//! Compiles lib/cuda/kernels/gradkit.cu with the host C++ compiler under src/emu.h: once as
//! it is (block threads as fibers), once with block threads as OS threads, and once per
//! planted bug, each variant with its own entry point.

fn main() {
    let kernels = "../cuda/kernels";
    for f in ["src/emu.h", "src/emu.cpp", "../cuda/kernels/gradkit.cu"] {
        println!("cargo:rerun-if-changed={f}");
    }
    for (lib, entry, plant) in [
        ("gk_emu_plain", "gk_emu_launch", None),
        (
            "gk_emu_threads",
            "gk_emu_launch_threads",
            Some("GK_EMU_THREADS"),
        ),
        (
            "gk_emu_compact",
            "gk_emu_launch_plant_compact",
            Some("GRADKIT_PLANT_COMPACT_OFF_BY_ONE"),
        ),
        (
            "gk_emu_sign",
            "gk_emu_launch_plant_sign",
            Some("GRADKIT_PLANT_SIGN_GT_FOR_GE"),
        ),
        (
            "gk_emu_threshold",
            "gk_emu_launch_plant_threshold",
            Some("GRADKIT_PLANT_THRESHOLD_GE_FOR_GT"),
        ),
    ] {
        let mut b = cc::Build::new();
        b.cpp(true)
            .file("src/emu.cpp")
            .include("src")
            .include(kernels)
            .std("c++20")
            // The CPU rounds a*b + c twice; so does the GPU build (--fmad=false).
            .flag("-ffp-contract=off")
            .opt_level(1)
            .define("GK_EMU_ENTRY", entry);
        if let Some(p) = plant {
            b.define(p, None);
        }
        b.compile(lib);
    }
}
