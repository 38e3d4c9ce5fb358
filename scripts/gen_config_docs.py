"""Write docs/configuration.md from the code that reads the settings.

Every ScoutConfig field (scout_sglang/config.py, described by the comment on or
above its line), every other SCOUT_* variable (scout_sglang/env.py's
OTHER_VARIABLES, described in OTHER_VARIABLE_DOCS below), every preset in
configs/, and the server arguments the backend refuses (the reasons written in
sglang_adapter/backend.py and kv_pool.py) come from the code, so the page cannot
drift from it: tests/test_docs_configuration.py regenerates the page and
compares. A field without a comment, or a variable without its entry here, stops
this script.

    python -P scripts/gen_config_docs.py           # rewrite the page
    python -P scripts/gen_config_docs.py --check   # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
CONFIG_SOURCE = ROOT / "scout_sglang" / "config.py"
BACKEND_SOURCE = ROOT / "scout_sglang" / "sglang_adapter" / "backend.py"
POOL_SOURCE = ROOT / "scout_sglang" / "sglang_adapter" / "kv_pool.py"

# The SCOUT_* variables that are not ScoutConfig fields (env.OTHER_VARIABLES): default, accepted values, meaning.
OTHER_VARIABLE_DOCS = {
    "SCOUT_CONFIG": (
        "`default`",
        "a preset name (below) or the path of a `.yaml` file",
        "The preset the settings start from. Each `SCOUT_<FIELD>` then overrides one field of it.",
    ),
    "SCOUT_KV_POOL": (
        "`scout`",
        "`scout`, `stock`",
        "`scout`: SGLang's scheduler admits by a logical capacity held in host memory; the device holds only what "
        "co-attention needs (digests, windows, resident buffers, dense layers). `stock`: SGLang's own device pool, "
        "every token on the device (no memory saved; useful to compare).",
    ),
    "SCOUT_HOST_KV_GIB": (
        "unset",
        "a positive number of GiB",
        "Host memory for K/V. Sets the logical capacity (tokens = GiB / bytes of one token's K and V over all "
        "layers) instead of `--max-total-tokens`. One of the two is required with the scout KV pool. With tensor "
        "parallelism it is the whole server's: the ranks on a host split it.",
    ),
    "SCOUT_NATIVE_BUILD_DIR": (
        "unset (torch's extension cache)",
        "a writable directory, existing or creatable",
        "Where the native CPU attention kernel is built and cached on first use.",
    ),
    "SCOUT_LOG_LEVEL": (
        "unset (SGLang's level)",
        "`DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL` (any case)",
        "Level of the `scout_sglang` loggers. A bad value stops the server when `scout` is selected.",
    ),
    "SCOUT_CPU_DEADLINE_MS": (
        "`1000`",
        "a positive number of milliseconds",
        "How long after its submit a layer waits for its CPU part. Past it, the layer computes that part itself, "
        "exactly, from the host store, and counts a `deadline` fallback. The default is about ten times the "
        "largest CPU part at the default preset on a 2-core host.",
    ),
    "SCOUT_MAX_N": (
        "`16`",
        "a whole number, at least 1",
        "The most sequences one HTTP request may start (its `n` times its prompts). `/v1/chat/completions`, "
        "`/v1/completions` and `/generate` answer a request beyond it with HTTP 400 before anything streams "
        "(SGLang 0.5.23 has no bound of its own: one request could hold every request slot).",
    ),
    "SCOUT_DRAIN_S": (
        "`25`",
        "a non-negative number of seconds",
        "After SIGTERM, how long requests may still finish. Those still running then are aborted with HTTP 503 "
        "\"server shutting down\" (a stream gets it as its finish reason), and the server exits with its CPU "
        "worker threads joined. The default leaves 5 s of Kubernetes' 30 s grace period for the shutdown itself.",
    ),
    "SCOUT_TEST_FAULTS": (
        "unset",
        "`cpu_raise:P,cpu_delay:P,cpu_delay_ms:MS,cpu_drop:P,cpu_thread_exits:N,request_state:TEXT,seed:N` "
        "(P in [0, 1])",
        "Tests only: the CPU worker threads raise, or sleep, before that share of their queue entries; "
        "`cpu_drop:P` reports that share of the CPU parts done with empty results, so the merge keeps the device "
        "part alone (the fault tests' negative control: answers change where the CPU part decides them); "
        "`cpu_thread_exits:N` ends the threads that take the first N entries; `request_state:TEXT` drops, once, "
        "the engine state of each request whose id contains TEXT. Refused outside pytest unless "
        "`SCOUT_TEST_FAULTS_ALLOW=1`.",
    ),
    "SCOUT_TEST_FAULTS_ALLOW": (
        "unset",
        "`1`",
        "Allows `SCOUT_TEST_FAULTS` outside pytest (fault drills on a test server). Never set it in production.",
    ),
}

# Server arguments that matter to the scout backend (hand-written: they are SGLang's, not ours).
SGLANG_FLAGS = [
    ("`--attention-backend scout`", "Runs prefill and decode through scout (the `logical` KV pool)."),
    ("`--prefill-attention-backend X --decode-attention-backend scout`",
     "Split backends: X runs prefill and writes a host pool; scout decodes (the `arrival` pool). On a GPU, X "
     "cannot write host memory: this is refused there (below)."),
    ("`--max-total-tokens N`", "The logical capacity in tokens, held in host memory (or `SCOUT_HOST_KV_GIB`). "
     "Required with the scout KV pool."),
    ("`--max-running-requests N`", "Request slots (default 64 with the scout KV pool). Each slot costs device "
     "memory for its windows and resident buffers in every offloaded layer."),
    ("`--page-size B`", "With the radix cache (SGLang's default) B must be the block size (`block_size`, 32 in "
     "`default`): a cached prefix is shared in whole blocks, each block in the page SGLang gives it, stored once "
     "in host memory. Requests whose prompts start with a cached prefix skip its prefill "
     "([deployment.md](deployment.md#prefix-reuse))."),
    ("`--disable-radix-cache`", "Optional with `--attention-backend scout` (no prefix reuse, any page size); "
     "required where scout only decodes (a PD decode instance, a split prefill backend)."),
    ("`--enable-metrics`", "Serves the `scout_*` series on `/metrics` (see [deployment.md](deployment.md#metrics))."),
    ("`--disaggregation-mode decode`", "Scout as the decode instance of a PD deployment (the `arrival` pool)."),
    ("`--kv-cache-dtype auto`", "The default, and the only kind accepted besides explicit bf16/fp16."),
    ("`--tp N`", "Accepted: query heads are split across ranks (tested end to end with N = 2, with and without the "
     "radix cache)."),
    ("`--cuda-graph-max-bs N`", "Decode CUDA graphs are SGLang's default full graphs: the whole step, the "
     "engine's kernels and the CPU part's hand-off included, is captured. Capturing beyond the request slots is "
     "an error: keep N <= `--max-running-requests`."),
]


@dataclasses.dataclass
class Field:
    name: str
    annotation: str
    default: str
    doc: str


def field_comments(source: str) -> dict[str, str]:
    """ScoutConfig field -> its comment (the comment lines above it, then the one on its line)."""
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ScoutConfig")
    out = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        parts = above + ([comments[node.lineno]] if node.lineno in comments else [])
        out[node.target.id] = " ".join(parts)
    return out


def config_fields() -> list[Field]:
    from scout_sglang.config import ScoutConfig

    comments = field_comments(CONFIG_SOURCE.read_text())
    fields = []
    for f in dataclasses.fields(ScoutConfig):
        if f.name == "extra":
            continue
        doc = comments.get(f.name, "")
        if not doc:
            raise SystemExit(f"ScoutConfig.{f.name} has no comment in {CONFIG_SOURCE.relative_to(ROOT)}: "
                             "describe it there (the comment is its documentation)")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        fields.append(Field(f.name, str(f.type), value_text(default), doc))
    return fields


def value_text(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) if value else "(empty)"
    return str(value)


def accepted_text(name: str, annotation: str) -> str:
    from scout_sglang.env import CHOICES

    if name in CHOICES:
        return ", ".join(f"`{'none' if c is None else c}`" for c in CHOICES[name])
    kind = annotation.split(" ")[0].split("[")[0]
    text = {"tuple": "comma-separated integers (empty: none)", "bool": "`1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`",
            "int": "integer", "float": "number"}.get(kind, kind)
    if "None" in annotation and name not in CHOICES:
        text += "; `none`, `auto` or empty: none"
    return text


def preset_rows(fields: list[Field]) -> tuple[list[str], list[list[str]]]:
    from scout_sglang.config import ScoutConfig
    from scout_sglang.env import available_presets, load_preset

    names = available_presets()
    configs = {name: ScoutConfig(**load_preset(name)) for name in names}
    rows = []
    for f in fields:
        rows.append([f"`{f.name}`"] + [value_text(getattr(configs[n], f.name)) for n in names])
    rows.append(["`topk_blocks` (derived)"] + [str(configs[n].topk_blocks) for n in names])
    return names, rows


def _expr_text(node: ast.AST) -> str:
    """A message with its f-string fields written as <name>."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        out = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                out.append(str(value.value))
            else:
                inner = value.value
                name = inner.attr if isinstance(inner, ast.Attribute) else ast.unparse(inner)
                out.append(f"<{name}>")
        return "".join(out)
    return ast.unparse(node)


def refusals(path: Path, function: str, variable: str) -> list[str]:
    """The messages `function` in `path` appends to its list `variable` (the server's start-up refusals)."""
    tree = ast.parse(path.read_text())
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    out = []
    for node in ast.walk(func):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == variable and node.args):
            out.append((node.lineno, _expr_text(node.args[0])))
    return [text for _, text in sorted(out)]


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def render() -> str:
    from scout_sglang.env import OTHER_VARIABLES, PREFIX

    missing = sorted(OTHER_VARIABLES - set(OTHER_VARIABLE_DOCS))
    if missing:
        raise SystemExit(f"{missing} are read in scout_sglang/env.py but not described in scripts/gen_config_docs.py "
                         "(OTHER_VARIABLE_DOCS): add them there")
    stale = sorted(set(OTHER_VARIABLE_DOCS) - OTHER_VARIABLES)
    if stale:
        raise SystemExit(f"scripts/gen_config_docs.py describes {stale}, which scout_sglang/env.py no longer reads")
    fields = config_fields()
    out = [
        "# Configuration",
        "",
        "<!-- Generated by scripts/gen_config_docs.py from scout_sglang/config.py and scout_sglang/env.py."
        " Do not edit: change the code (or the script's text) and run `python -P scripts/gen_config_docs.py`. -->",
        "",
        "Settings are environment variables, read in one place (`scout_sglang/env.py`) when the server starts. "
        "The effective configuration is logged once at start-up (`scout attention backend configuration:`). "
        "SGLang drops command-line flags it does not know, so the plugin has none of its own.",
        "",
        "How a configuration is built:",
        "",
        "1. `SCOUT_CONFIG` names a preset (default: `default`) or a YAML file of `field: value` lines.",
        "2. Each `SCOUT_<FIELD>` overrides one field, e.g. `SCOUT_MODE=quest`, `SCOUT_TOKEN_BUDGET=1024`, "
        "`SCOUT_DENSE_LAYERS=0,1`, `SCOUT_KERNEL_IMPL=none`.",
        "3. The result is validated as a whole; every problem is reported at once.",
        "",
        "An unknown `SCOUT_*` name, an unparsable value, or a value outside the accepted ones stops the server "
        "with a message naming the variable and what it accepts ([troubleshooting.md](troubleshooting.md) lists the messages). A "
        "typo must not be ignored.",
        "",
        "## Co-attention settings (`ScoutConfig`)",
        "",
        "One line per field of `ScoutConfig` (`scout_sglang/config.py`), with its variable, its default and "
        "what it accepts.",
        "",
    ]
    rows = [[f"`{PREFIX}{f.name.upper()}`", f"`{f.default}`", accepted_text(f.name, f.annotation), f.doc]
            for f in fields]
    out += table(["variable", "default", "accepts", "meaning"], rows)
    out += [
        "",
        "Derived: `topk_blocks = token_budget // block_size`, the blocks attended per (request, layer, KV head), "
        "sink and local blocks included. `resident_blocks` and `max_cpu_blocks` default to it.",
        "",
        "## Other variables",
        "",
    ]
    out += table(["variable", "default", "accepts", "meaning"],
                 [[f"`{name}`", *OTHER_VARIABLE_DOCS[name]] for name in sorted(OTHER_VARIABLES)])
    names, preset_table = preset_rows(fields)
    out += [
        "",
        "## Presets",
        "",
        "The YAML files in `configs/` (installed as `scout_sglang.configs`); `SCOUT_CONFIG=<name>` selects one. "
        "Values as the preset sets them, defaults elsewhere:",
        "",
    ]
    out += table(["field", *[f"`{n}`" for n in names]], preset_table)
    out += [
        "",
        "`default` is the method's own setting (block 32, budget 2048, layer 0 dense, adaptive recall at 12%). "
        "`tiny` is for the bundled small models and CPU-only tests. The model presets hold the same values until "
        "per-layer recall intervals are profiled on the real weights (`python -m scout_sglang.profiler`).",
        "",
        "## SGLang server arguments that matter",
        "",
    ]
    out += table(["argument", "why"], [list(row) for row in SGLANG_FLAGS])
    out += [
        "",
        "## Refused at start-up",
        "",
        "The server stops with one of these reasons (each says what to do instead). From "
        "`unsupported_reasons` in `scout_sglang/sglang_adapter/backend.py`, under "
        "`the scout attention backend cannot run this server:`",
        "",
    ]
    out += [f"- {text}" for text in refusals(BACKEND_SOURCE, "unsupported_reasons", "reasons")]
    out += [
        "",
        "From `pool_problems` in `scout_sglang/sglang_adapter/kv_pool.py`, under "
        "`the scout KV pool cannot serve this server:` (not checked with `SCOUT_KV_POOL=stock`)",
        "",
    ]
    out += [f"- {text}" for text in refusals(POOL_SOURCE, "pool_problems", "problems")]
    out += [
        "",
        "Also refused: a stock prefill backend with scout decoding on a GPU (it cannot write the host pool): use "
        "`--attention-backend scout`, a PD decode instance, or `SCOUT_KV_POOL=stock`. A model without the decoder "
        "layers that layer-ahead prediction needs (SGLang's minimal test runner) is not refused: prediction turns "
        "off with a warning and each layer selects with its real query. See [troubleshooting.md](troubleshooting.md) for every "
        "message.",
        "",
    ]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from the code")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python -P scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
