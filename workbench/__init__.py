"""workbench: serve TensorFlow models from a notebook, speaking TF Serving's REST API."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
