"""Launching a real SGLang server and talking to it over HTTP (no sglang import here)."""
