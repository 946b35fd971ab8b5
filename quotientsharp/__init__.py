"""quotientsharp: Riemannian geometry on the symmetry quotients of neural networks."""

from . import checks, reference
from .diagonal import DiagonalQuotient
from .gl import GLQuotient
from .quotient import SymmetryQuotient
from .sharpness import SharpnessResult, sharpness
from .validation import value_checks

__version__ = "0.1.0"

__all__ = ["checks", "DiagonalQuotient", "GLQuotient", "SharpnessResult", "SymmetryQuotient",
           "sharpness", "reference", "value_checks", "__version__"]
