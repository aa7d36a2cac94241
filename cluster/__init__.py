"""The regression cluster: a Python port of the Artifex Ghostscript/MuPDF test cluster."""

__version__ = "0.1.0"
