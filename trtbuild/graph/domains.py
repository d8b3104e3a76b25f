"""ONNX's default operator domain, as models spell it.

Why a module of one fact: the default domain is written "" or "ai.onnx" (the two are the
same domain to onnx.checker and every runtime), and every question "is this a standard
op" must accept both; one tuple, read everywhere, keeps a second spelling from being
forgotten in one of them.
"""

from __future__ import annotations

DEFAULT_DOMAINS = ("", "ai.onnx")
