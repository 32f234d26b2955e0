"""gradkit from Python: record gradients from a training loop as `tensor/1` traces
(`Recorder`), read traces back as numpy arrays or torch tensors (`Trace`, `read_step`), and
train with gradkit's allreduces (`Reducer`, `Metrics`, `mpi_comm`; `gradkit.torch` for
torch.distributed and DDP). The format is docs/FORMAT.md; the walk-through from a DDP run to a
figure, and training with the exchanges, are docs/PYTORCH.md."""

from .reader import Coo, Layer, Trace, read_step
from .native import Metrics, Reducer, algorithms, mpi_comm
from .recorder import Recorder, __version__, strip_wrappers

__all__ = [
    "Recorder", "Trace", "read_step", "Coo", "Layer", "strip_wrappers", "__version__",
    "Reducer", "Metrics", "mpi_comm", "algorithms",
]
