"""The root Dockerfile, checked without Docker: sources, sglang pin, packages, launch command.

Each check returns a list of problems (empty when fine); the last test feeds a broken
Dockerfile to every check so none of them can pass by accident.
"""

import ast
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from scout_sglang.sglang_adapter.version import SGLANG_VERSION

ROOT = Path(__file__).resolve().parents[1]
BASE_IMAGE = "lmsysorg/sglang"
FORBIDDEN_FOLDERS = ("cpu_serving",)


def instructions(text):
    """[(KEYWORD, arguments)] with comments dropped and `\\` continuations joined."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\s*\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, arguments = line.strip().partition(" ")
            result.append((keyword.upper(), arguments.strip()))
    return result


def _normalized(path):
    return path.removeprefix("./").rstrip("/") or "."


def copies(text):
    """[(source, destination)] of every COPY/ADD from the build context, paths normalized."""
    pairs = []
    for keyword, arguments in instructions(text):
        if keyword not in ("COPY", "ADD"):
            continue
        words = json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments)
        if any(w.startswith("--from") for w in words):
            continue  # from another stage or image, not the repository
        *sources, destination = [w for w in words if not w.startswith("--")]
        pairs += [(_normalized(s), _normalized(destination)) for s in sources]
    return pairs


def missing_sources(text, root):
    return [f"COPY source {s!r} does not exist" for s, _ in copies(text) if not (root / s).exists()]


def base_image_version(text):
    """The sglang version of the FROM image, with ARG defaults substituted; None if not the official image."""
    args = {}
    for keyword, arguments in instructions(text):
        if keyword == "ARG" and "=" in arguments:
            name, _, default = arguments.partition("=")
            args[name.strip()] = default.strip()
        if keyword == "FROM":
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), arguments.split()[0])
            match = re.fullmatch(re.escape(BASE_IMAGE) + r":v(\S+)", image)
            return match.group(1) if match else None
    return None


def pyproject_sglang_pin(root):
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sglang"]
    (pin,) = [req.split("==", 1)[1] for req in extra if req.startswith("sglang==")]
    return pin


def version_problems(text, *, pinned, adapter):
    image = base_image_version(text)
    if image is None:
        return [f"FROM is not {BASE_IMAGE}:v<version>"]
    return [f"image sglang {image} != {name} {version}"
            for name, version in (("pyproject pin", pinned), ("adapter SGLANG_VERSION", adapter)) if image != version]


def setup_package_roots(root):
    """setup.py's PACKAGE_ROOTS, read with ast so that setup() does not run."""
    for node in ast.parse((root / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PACKAGE_ROOTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no PACKAGE_ROOTS")


def uncopied_roots(text, package_roots):
    """Folders setup.py maps that are not copied to the same place (setup.py finds them by that path)."""
    pairs = set(copies(text))
    return [f"package root {folder!r} ({package}) is not copied to {folder}/"
            for package, folder in package_roots.items() if (folder, folder) not in pairs and (".", ".") not in pairs]


def forbidden_copies(text):
    return [f"COPY {s!r} puts {folder}/ in the image" for s, _ in copies(text)
            for folder in FORBIDDEN_FOLDERS if s == "." or s.split("/")[0] == folder]


def launch_problems(text):
    """The last CMD must run `python3 -m sglang.launch_server ... --attention-backend scout`."""
    commands = [arguments for keyword, arguments in instructions(text) if keyword == "CMD"]
    if not commands:
        return ["no CMD"]
    words = json.loads(commands[-1]) if commands[-1].startswith("[") else shlex.split(commands[-1])
    if words[:2] == ["sh", "-c"]:
        words = shlex.split(words[2])
    problems = []
    if not any(words[i:i + 2] == ["-m", "sglang.launch_server"] for i in range(len(words))):
        problems.append("CMD does not run -m sglang.launch_server")
    if not any(words[i:i + 2] == ["--attention-backend", "scout"] for i in range(len(words))):
        problems.append("CMD does not pass --attention-backend scout")
    return problems


def image_env(text):
    """The ENV settings of the image, `ENV NAME=value` form."""
    env = {}
    for keyword, arguments in instructions(text):
        if keyword == "ENV":
            for word in shlex.split(arguments):
                name, _, value = word.partition("=")
                env[name] = value
    return env


def start_up_refusals(text):
    """What the scout KV pool's start-up checks refuse in the image's default command, with the image's ENV:
    the same checks the server runs (the radix cache, the logical capacity)."""
    pytest.importorskip("sglang")
    import argparse

    from sglang.srt.server_args import ServerArgs

    from scout_sglang.env import config_from_env, pool_settings_from_env
    from scout_sglang.sglang_adapter import plugin
    from scout_sglang.sglang_adapter.kv_pool import logical_capacity, pool_problems

    plugin.register()  # `scout` among the --attention-backend choices, as the entry point makes it

    commands = [arguments for keyword, arguments in instructions(text) if keyword == "CMD"]
    words = json.loads(commands[-1])
    words = shlex.split(words[2]) if words[:2] == ["sh", "-c"] else words
    words = [w.replace('"$MODEL_PATH"', "/models/model").replace("$MODEL_PATH", "/models/model") for w in words]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(words[words.index("sglang.launch_server") + 1:])
    refusals = pool_problems(args, "logical", config_from_env(image_env(text)).block_size)
    try:
        logical_capacity(args.max_total_tokens, pool_settings_from_env(image_env(text)), token_bytes=2**17,
                         page_size=args.page_size or 1)
    except RuntimeError as exc:
        refusals.append(str(exc))
    return refusals


DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_the_default_command_passes_the_scout_pools_start_up_checks():
    assert start_up_refusals(DOCKERFILE) == []
    bare = 'CMD ["sh", "-c", "exec python3 -m sglang.launch_server --model-path x --attention-backend scout"]\n'
    assert len(start_up_refusals(bare)) == 2  # the radix cache with pages of one token, and no capacity


def test_every_copied_source_exists():
    assert missing_sources(DOCKERFILE, ROOT) == []


def test_base_image_matches_the_sglang_pin():
    assert version_problems(DOCKERFILE, pinned=pyproject_sglang_pin(ROOT), adapter=SGLANG_VERSION) == []


def test_every_setup_package_root_is_copied():
    roots = setup_package_roots(ROOT)
    assert set(roots.values()) >= {"scout_sglang", "kernels", "cpu_worker", "configs"}
    assert uncopied_roots(DOCKERFILE, roots) == []


def test_cpu_serving_is_not_copied():
    assert forbidden_copies(DOCKERFILE) == []


def test_default_command_launches_sglang_with_scout():
    assert launch_problems(DOCKERFILE) == []


BROKEN = """\
ARG SGLANG_VERSION=0.5.22
FROM lmsysorg/sglang:v${SGLANG_VERSION}
COPY pyproject.toml no_such_file.txt ./
COPY kernels/ ./
COPY cpu_serving/ cpu_serving/
CMD ["sh", "-c", "python3 -m sglang.launch_server \\
     --attention-backend triton"]
"""


def test_every_check_reports_a_broken_dockerfile():
    assert missing_sources(BROKEN, ROOT) == ["COPY source 'no_such_file.txt' does not exist"]
    assert len(version_problems(BROKEN, pinned="0.5.23", adapter="0.5.23")) == 2
    assert version_problems("FROM python:3.12\n", pinned="0.5.23", adapter="0.5.23") == ["FROM is not lmsysorg/sglang:v<version>"]
    uncopied = uncopied_roots(BROKEN, setup_package_roots(ROOT))
    assert len(uncopied) == 4 and any("'kernels'" in p for p in uncopied)  # kernels/ flattened into ./
    assert forbidden_copies(BROKEN) == ["COPY 'cpu_serving' puts cpu_serving/ in the image"]
    assert forbidden_copies("FROM x\nCOPY . .\n") == ["COPY '.' puts cpu_serving/ in the image"]
    assert launch_problems(BROKEN) == ["CMD does not pass --attention-backend scout"]
    assert launch_problems("FROM x\n") == ["no CMD"]
