"""The only package that imports sglang: plugin entry point, backend, memory pool."""
