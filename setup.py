"""Package discovery for the folder-to-package mapping (README, Layout).

`kernels/`, `cpu_worker/` and `configs/` sit at the repository root but install
as `scout_sglang.kernels`, `scout_sglang.cpu_worker` and `scout_sglang.configs`: a top-level `kernels`
would clash with the PyPI distribution of that name that sglang depends on.
Every subpackage below each root is discovered here, so a new one can never be
left out of the wheel (tests/test_packaging.py checks the built wheel).
"""

from setuptools import find_packages, setup

PACKAGE_ROOTS = {
    "scout_sglang": "scout_sglang",
    "scout_sglang.kernels": "kernels",
    "scout_sglang.cpu_worker": "cpu_worker",
    "scout_sglang.configs": "configs",
}


def _discover():
    packages, package_dir = [], {}
    for name, folder in PACKAGE_ROOTS.items():
        package_dir[name] = folder
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_packages(folder)]
    return packages, package_dir


packages, package_dir = _discover()
setup(packages=packages, package_dir=package_dir)
