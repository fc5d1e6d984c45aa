"""Op-level automatic differentiation: one tape engine for both backends.

* :class:`Tensor` (``dnnbind.Tensor``): what ``keras.ops`` returns on NumPy and on CUDA;
* :class:`Variable` (``keras.Variable``): a mutable array gradients flow to;
* :class:`GradientTape`: TensorFlow's tape API (``tape.gradient(loss, variables)``);
* :class:`Function` / :func:`custom_gradient`: user-defined VJPs;
* :mod:`.engine`: nodes, recording, reverse accumulation.

Imports: this room sits above :mod:`dnnbind.kernels` and below :mod:`dnnbind.ops`, which installs the
operators on :class:`Tensor` and :class:`Variable` and the few functions the engine needs
(``engine.hooks``) when it is imported.
"""

from . import engine
from .engine import Leaf, Node, record, recording, stop_recording
from .function import Function, FunctionCtx, custom_gradient
from .tape import GradientTape
from .tensor import FilledTensor, Tensor, install_operators, is_tensor
from .variable import Variable

__all__ = ["engine", "Tensor", "FilledTensor", "Variable", "GradientTape", "Function", "FunctionCtx",
           "custom_gradient", "Node", "Leaf", "record", "recording", "stop_recording", "install_operators",
           "is_tensor"]
