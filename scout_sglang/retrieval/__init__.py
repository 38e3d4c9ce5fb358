"""A small model trained here on synthetic long-context retrieval, and its accuracy evaluation.

Its correct answers depend on attending to a few far-away tokens, which is
exactly what sparse attention can get wrong (data.py describes the task).
"""
