// The kernels of lib/cuda/kernels/gradkit.cu compiled for the host under emu.h. build.rs
// compiles this file once per variant (plain and each planted bug), each with its own
// GK_EMU_ENTRY name, so one test binary holds them all.
#include "emu.h"

#include <cstring>

namespace {
#include "gradkit.cu"
}  // namespace

#ifndef GK_EMU_ENTRY
#define GK_EMU_ENTRY gk_emu_launch
#endif

// Launches kernel `name` over grid x block threads; 0 on success, 1 for an unknown name, 2
// for a block size other than the kernels' GK_BLOCK.
extern "C" int GK_EMU_ENTRY(const char* name, u32 grid, u32 block, void** params) {
  if (block != GK_BLOCK) return 2;
#define GK_TRY(k)                                 \
  if (std::strcmp(name, #k) == 0) {               \
    gk_emu::launch(&k, grid, block, params);      \
    return 0;                                     \
  }
  GK_KERNELS(GK_TRY)
#undef GK_TRY
  return 1;
}
