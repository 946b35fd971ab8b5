"""quotientsharp: Riemannian geometry on the symmetry quotients of neural networks."""

from . import checks, reference
from .adaptive import AdaptiveQuotient
from .diagonal import DiagonalQuotient
from .frozen import FrozenPoint
from .gl import GLQuotient
from .models import QuotientBinding, find_symmetries
from .product import ProductQuotient
from .quotient import ClosedFormQuotient, SymmetryQuotient
from .sharpness import SharpnessResult, sharpness
from .validation import value_checks

__version__ = "0.1.0"

__all__ = ["AdaptiveQuotient", "ClosedFormQuotient", "DiagonalQuotient", "FrozenPoint",
           "GLQuotient", "ProductQuotient", "QuotientBinding", "SharpnessResult",
           "SymmetryQuotient", "checks", "find_symmetries", "reference", "sharpness",
           "value_checks", "__version__"]
