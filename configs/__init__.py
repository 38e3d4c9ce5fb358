"""Configuration presets (YAML), installed as scout_sglang.configs.

`default.yaml` is the generic preset; model presets carry per-layer recall
intervals from the offline profiler. Load them with scout_sglang.env.
"""
