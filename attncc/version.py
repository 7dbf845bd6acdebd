"""attncc's version, in a module that imports nothing: generated-module headers and cubin cache
keys read it without importing the package root (which imports nearly every module)."""

__version__ = "0.1.0"
