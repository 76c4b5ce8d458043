"""Pitstop: GPU-cluster fault remediation on Google Cloud."""

__version__ = "0.1.0"
