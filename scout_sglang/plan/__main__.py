"""python -m scout_sglang.plan: what a GPU box holds and decodes with scout, against the stock backend.

    python -m scout_sglang.plan --model Qwen3-14B --gpu H100 --context 65536 --output-len 1024 \\
        [--budget 2048] [--cpu-split auto] [--measure] [--json] [--plot out.png]

--model takes a preset (Qwen3-8B, Qwen3-14B, Qwen3-32B, Llama-3.1-8B, needle-llama), a config.json or a
model directory. Every input printed says whether it was measured, looked up, assumed or given.
"""

from __future__ import annotations

import argparse
import json
import sys

from scout_sglang.config import MODES
from scout_sglang.plan.gpus import GPUS
from scout_sglang.plan.planner import FLAGS

HELP = {  # planner.FLAGS key -> help
    "gpu_memory": "device memory, GiB (replaces the table's)",
    "hbm_bandwidth": "device memory bandwidth, GB/s",
    "pcie_bandwidth": "host link bandwidth, one direction, GB/s",
    "peak_bf16": "peak dense bf16 TFLOP/s",
    "cpu_attention": "K/V GB/s the host's CPU attention reads (default: assumed, or --measure)",
    "launch_us": "host cost of one kernel launch, us",
    "sync_us": "host cost of one device-to-host read, us",
    "host_memory": "host memory, GiB (default: this host's)",
    "mem_fraction": "SGLang's share of device memory for weights and K/V",
    "change_rate": "share of the selected blocks that change per token",
    "max_running_requests": "cap on the batch (request slots)",
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scout_sglang.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="preset name, config.json, or model directory")
    parser.add_argument("--gpu", default="H100", help=f"one of {', '.join(GPUS)}, or custom (give every GPU figure)")
    parser.add_argument("--context", type=int, default=65536, help="input tokens per request")
    parser.add_argument("--output-len", type=int, default=1024, help="output tokens per request")
    parser.add_argument("--shared-prefix", type=int, default=0,
                        help="input tokens every request shares (a system prompt or document under the radix cache: "
                             "held once, in whole blocks)")
    parser.add_argument("--budget", type=int, default=None, help="scout token budget (default: the preset's)")
    parser.add_argument("--block-size", type=int, default=None, help="scout block size (default: the preset's)")
    parser.add_argument("--scout-config", default="default", help="scout preset name or YAML file")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to plan")
    parser.add_argument("--cpu-split", default="off",
                        help="scout's CPU list: off (all on the CPU workers), auto (the CPU share that balances the "
                             "CPU against the GPU's zero-copy reads over PCIe), or a CPU share in [0, 1]")
    parser.add_argument("--host-overhead", default=None, help="host_overhead.json to read launch counts from")
    parser.add_argument("--measure", action="store_true", help="measure this host's CPU figures (about 10 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--plot", default=None, help="write throughput against context to this PNG")
    for name, flag in FLAGS.items():
        parser.add_argument(flag, dest=name, type=float, default=None, help=HELP[name])
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from scout_sglang.plan.models import load_model
    from scout_sglang.plan.planner import PlanRequest, plan
    from scout_sglang.plan.report import json_report, plot, text_report

    try:
        overrides = {name: getattr(args, name) for name in FLAGS}
        if overrides["max_running_requests"] is not None:
            overrides["max_running_requests"] = int(overrides["max_running_requests"])
        request = PlanRequest(model=load_model(args.model), gpu=args.gpu, context=args.context,
                              output_len=args.output_len, shared_prefix=args.shared_prefix, scout_preset=args.scout_config, budget=args.budget,
                              block_size=args.block_size, itemsize=4 if args.dtype == "float32" else 2,
                              measure=args.measure, modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
                              overrides=overrides, host_overhead_path=args.host_overhead, cpu_split=args.cpu_split)
        result = plan(request)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(json_report(result)) if args.json else text_report(result))
    if args.plot:
        try:
            plot(result, args.plot)
        except ImportError as error:  # matplotlib is a dev dependency, not the package's
            print(f"error: --plot needs matplotlib ({error})", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
