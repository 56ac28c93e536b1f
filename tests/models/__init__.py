"""Tiny models written as code, shared by every test package."""
