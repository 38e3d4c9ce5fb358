"""Small Llama / Qwen3 causal LMs with random weights, built locally (no hub)."""

from __future__ import annotations

import torch


def tiny_model(arch: str = "llama", *, num_layers: int = 3, hidden: int = 64, num_heads: int = 4, num_kv_heads: int = 2,
               head_dim: int = 16, vocab: int = 128, max_positions: int = 4096, seed: int = 0,
               init_std: float = 0.2, dtype=torch.float32, intermediate: int | None = None, device=None):
    """A random-weight model in eval mode. A large `init_std` gives peaked logits,
    so greedy decoding has no near-ties for rounding to flip. `intermediate`: the MLP's width (default 2 x
    hidden); `device`: where the weights are made (a GPU makes a full-size model's random weights in seconds and
    in `dtype` from the start, not in fp32 in host memory first)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                  num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
                  max_position_embeddings=max_positions, initializer_range=init_std, tie_word_embeddings=False)
    if arch == "llama":
        config, model_class = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen3":
        config, model_class = Qwen3Config(**common), Qwen3ForCausalLM
    else:
        raise ValueError(f"arch must be 'llama' or 'qwen3', got {arch!r}")
    torch.manual_seed(seed)
    if device is None:
        model = model_class(config).to(dtype)
    else:
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = model_class(config)
        finally:
            torch.set_default_dtype(default)
    return model.eval()


TOKENIZER_CORPUS = (
    "the quick brown fox jumps over the lazy dog. a key and a value are hidden in a long text. "
    "find the value of the key. scout attention keeps important blocks on the device and "
    "computes the rest on the cpu one layer ahead. hello world, how are you today? "
    "numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20."
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(vocab: int = 256):
    """A byte-level BPE tokenizer trained offline on a built-in corpus, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|pad|>", "<|bos|>", "<|eos|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([TOKENIZER_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny_model(directory, arch: str = "llama", **model_kwargs):
    """Write a random-weight tiny model and its tokenizer with save_pretrained; returns the path."""
    tokenizer = build_tokenizer()
    vocab = max(len(tokenizer), model_kwargs.pop("vocab", 0))
    model = tiny_model(arch, vocab=vocab, **model_kwargs)
    model.config.bos_token_id = tokenizer.bos_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
