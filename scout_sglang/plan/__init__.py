"""Planning a deployment before it exists: `python -m scout_sglang.plan`.

  models.py      a model's dimensions, from config.json or a preset
  gpus.py        the looked-up GPU table
  figures.py     Figure: a value labelled measured / looked up / assumed / given
  measure.py     host figures measured here (--measure)
  host_counts.py the engine's launches and host reads per layer, read from host_overhead.json
  capacity.py    device and host bytes, max batch (the server's own planning code)
  step_model.py  the decode step's time per mode (docs/performance_model.md)
  planner.py     inputs -> capacity and step of each mode -> a recommended preset
  report.py      table, JSON, plot
"""
