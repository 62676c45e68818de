"""pilot: run unmodified CUDA programs on a shared GPU through one daemon."""

__version__ = "0.1.0"
