"""ONNX Runtime sessions: ordered providers with fallback (CPU last), options, and what actually ran."""

from .session import SessionConfig, SessionInfo, available_providers, create_session, resolve_providers

__all__ = ["SessionConfig", "SessionInfo", "available_providers", "create_session", "resolve_providers"]
