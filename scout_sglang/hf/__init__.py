"""Hugging Face transformers drivers of the engine (imports transformers lazily).

reference_decoder.py  runs CoAttentionEngine inside a Llama/Qwen3 model, token by token
tiny_models.py        small random-weight Llama/Qwen3 models built locally
"""
