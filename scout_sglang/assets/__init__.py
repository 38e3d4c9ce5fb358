"""Files shipped with the package: the retrieval model trained by scout_sglang.retrieval.train."""
