"""Tandem: speculative decoding split across machines (drafter, verifier, gateway over gRPC)."""

__version__ = "0.1.0"
