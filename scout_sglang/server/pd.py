"""Launch a prefill/decode (PD) disaggregated deployment with scout on the decode side:
a stock prefill server, a scout decode server and SGLang's PD router, on free
loopback ports; stop all three with their process groups.

    python -m scout_sglang.server.pd --model-path MODEL [--transfer-backend mooncake]

prints the router's URL (clients talk to it) and runs until interrupted. The flags
and environment it adds are the constants below; docs/deployment.md shows them, and
the end-to-end test (tests/test_sglang_pd.py) runs exactly this launcher.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from scout_sglang.env import config_from_env
from scout_sglang.server.launch import free_port, launched_on_free_port, launched_server

# Both instances. Mooncake over TCP on loopback: no RDMA device is needed (a deployment with one sets
# MOONCAKE_PROTOCOL=rdma and its own SGLANG_HOST_IP). Early sending of a cached prefix is off: with a radix
# cache hit on the prefill instance it needs CUDA events.
PD_ENV = {"MOONCAKE_PROTOCOL": "tcp", "SGLANG_HOST_IP": "127.0.0.1",
          "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0"}
# The prefill instance: a stock attention backend (scout only decodes).
PREFILL_ARGS = ("--disaggregation-mode", "prefill", "--attention-backend", "torch_native")
# The decode instance: scout; it needs no radix cache, and no retraction backup (SGLang's copies its own pool,
# which holds no decoded token's K/V under scout: the backend refuses any other setting).
DECODE_ARGS = ("--disaggregation-mode", "decode", "--attention-backend", "scout", "--disable-radix-cache",
               "--disaggregation-decode-retraction-backup", "none")
# Moves K/V into a scout decode instance (tested). NIXL is refused (kv_pool.py); `fake` moves nothing and SGLang
# takes it on a decode instance only.
TRANSFER_BACKENDS = ("mooncake",)


@dataclasses.dataclass(frozen=True)
class PdUrls:
    router: str
    prefill: str
    decode: str


@contextlib.contextmanager
def launched_pd(model_path, *, common_args=(), prefill_args=(), decode_args=(), env: dict | None = None,
                transfer_backend: str = "mooncake", log_dir=None, device: str = "cpu"):
    """Yields the PdUrls of a running prefill + decode + router; stops all three on exit.

    `common_args` go to both servers, `prefill_args` / `decode_args` after the defaults above; `env` is added to
    both servers' environment (the decode instance reads SCOUT_* from it). Both servers get pages of one scout
    block (page_args) unless `common_args` sets --page-size."""
    bootstrap = free_port()
    transfer = ("--disaggregation-transfer-backend", transfer_backend)
    environment = {**PD_ENV, **(env or {})}
    common_args = (*page_args(common_args, environment), *common_args)
    logs = Path(log_dir) if log_dir else None

    def log(name):
        return logs / f"{name}.log" if logs else None

    servers = [
        launched_server(model_path, *PREFILL_ARGS, *transfer, "--disaggregation-bootstrap-port", str(bootstrap),
                        *common_args, *prefill_args, env=environment, log_path=log("prefill"), device=device),
        launched_server(model_path, *DECODE_ARGS, *transfer, *common_args, *decode_args, env=environment,
                        log_path=log("decode"), device=device)]
    with contextlib.ExitStack() as stack:
        prefill, decode = entered_together(stack, servers)
        # /readiness: 200 once both workers are registered and healthy (/health answers before that)
        router_port, _ = stack.enter_context(launched_on_free_port(
            lambda port: router_command(prefill, bootstrap, decode, port), "/readiness", env=dict(os.environ),
            log_path=log("router"), what="router"))
        yield PdUrls(router=f"http://127.0.0.1:{router_port}", prefill=prefill, decode=decode)


def page_args(common_args, env: dict) -> tuple[str, ...]:
    """--page-size of scout's block size (from SCOUT_* in `env`, else this process's), unless the flags set one:
    the decode instance's arrival pool, where the K/V lands, is then the engine's host store (one copy)."""
    if any(arg == "--page-size" or arg.startswith("--page-size=") for arg in common_args):
        return ()
    return ("--page-size", str(config_from_env({**os.environ, **env}).block_size))


def entered_together(stack: contextlib.ExitStack, managers: list) -> list:
    """Enters the context managers at the same time (the two servers start in parallel) and registers each one
    that started with `stack`, so a failure of one still stops the others."""
    with concurrent.futures.ThreadPoolExecutor(len(managers)) as pool:
        futures = [pool.submit(manager.__enter__) for manager in managers]
        concurrent.futures.wait(futures)
    for manager, future in zip(managers, futures):
        if future.exception() is None:
            stack.push(manager.__exit__)
    for future in futures:
        if future.exception() is not None:
            raise future.exception()
    return [future.result() for future in futures]


def router_command(prefill: str, bootstrap_port: int, decode: str, port: int) -> list[str]:
    return [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
            "--prefill", prefill, str(bootstrap_port), "--decode", decode, "--host", "127.0.0.1", "--port", str(port)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--transfer-backend", default="mooncake", choices=TRANSFER_BACKENDS)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--common-args", default="", help="flags for both servers, as one shell-quoted string")
    parser.add_argument("--prefill-args", default="", help="more flags for the prefill server")
    parser.add_argument("--decode-args", default="", help="more flags for the scout decode server")
    parser.add_argument("--log-dir", default=None, help="write prefill.log, decode.log and router.log here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds launched_pd: all three are stopped
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    with launched_pd(args.model_path, common_args=shlex.split(args.common_args),
                     prefill_args=shlex.split(args.prefill_args), decode_args=shlex.split(args.decode_args),
                     transfer_backend=args.transfer_backend, log_dir=args.log_dir, device=args.device) as urls:
        print(f"router {urls.router}  prefill {urls.prefill}  decode {urls.decode}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
