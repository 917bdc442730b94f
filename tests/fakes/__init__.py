"""Test doubles: a real local judge server."""
