"""What the figure tests read from matplotlib's artists."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def values(data: ArrayLike) -> list[float]:
    """A line's x or y data as a list of floats."""
    return [float(v) for v in np.asarray(data).ravel()]
