"""gradkit from Python: record gradients from a training loop as `tensor/1` traces
(`Recorder`), and read traces back as numpy arrays or torch tensors (`Trace`, `read_step`).
The format is docs/FORMAT.md; the walk-through from a DDP run to a figure is docs/PYTORCH.md."""

from .reader import Coo, Layer, Trace, read_step
from .recorder import Recorder, __version__, strip_wrappers

__all__ = ["Recorder", "Trace", "read_step", "Coo", "Layer", "strip_wrappers", "__version__"]
