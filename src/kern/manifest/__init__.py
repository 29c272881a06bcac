"""Manifest v1: typed schema, expressions, verifier, serving protocol."""

from .schema import Manifest
from .problems import ManifestError, Problem
from .verify import Report, Verified, check, load_verified, verify_path, verify_text

__all__ = ["Manifest", "ManifestError", "Problem", "Report", "Verified", "check", "load_verified",
           "verify_path", "verify_text"]
