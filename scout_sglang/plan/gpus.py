"""Known GPUs: memory, HBM and PCIe bandwidth, peak bf16 tensor throughput.

Looked-up figures for the step-time model (step_model.py). Any of them can be
replaced on the command line (--hbm-gbs, --gpu-mem-gib, --pcie-gbs, --tflops),
which the report then labels "given".
"""

from __future__ import annotations

from dataclasses import dataclass

from scout_sglang.plan.figures import Figure


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model as the planner sees it.

    Parameters
    ----------
    name : str
    memory_gib : float
        Device memory as the driver reports it (nvidia-smi's total), GiB.
    hbm_gbs : float
        Peak device memory bandwidth, GB/s (1e9 bytes/s).
    pcie_gbs : float
        Host link, one direction, theoretical GB/s (x16 lanes): what recalls and the CPU part's result cross.
    bf16_tflops : float
        Peak dense bf16 tensor throughput, TFLOP/s (without structured sparsity).
    source : str
    """

    name: str
    memory_gib: float
    hbm_gbs: float
    pcie_gbs: float
    bf16_tflops: float
    source: str

    def figures(self) -> dict[str, Figure]:
        how, src = "looked up", f"{self.name}: {self.source}"
        return {"gpu_memory": Figure(self.memory_gib, "GiB", how, src),
                "hbm_bandwidth": Figure(self.hbm_gbs, "GB/s", how, src),
                "pcie_bandwidth": Figure(self.pcie_gbs, "GB/s", how, src),
                "peak_bf16": Figure(self.bf16_tflops, "TFLOP/s", how, src)}


# Sources: NVIDIA's datasheets (H100 Tensor Core GPU, SXM5 80GB; H200 Tensor Core GPU, SXM 141GB; A100 80GB SXM;
# L40S; the Ada Lovelace architecture whitepaper for the RTX 4090's tensor throughput with FP32 accumulation).
# PCIe: Gen5 x16 = 64 GB/s and Gen4 x16 = 32 GB/s per direction (PCI-SIG's raw rate; pinned copies reach
# about 80% of it). Memory: the datasheet's GB as the driver reports it in MiB (H100 SXM 81559 MiB, H200 143771,
# A100 80GB 81920, L40S 46068, RTX 4090 24564).
GPUS = {
    "H100": GpuSpec("H100", 81559 / 1024, 3350, 64, 989, "NVIDIA H100 SXM5 datasheet, PCIe Gen5 x16"),
    "H200": GpuSpec("H200", 143771 / 1024, 4800, 64, 989, "NVIDIA H200 SXM datasheet, PCIe Gen5 x16"),
    "A100": GpuSpec("A100", 81920 / 1024, 2039, 32, 312, "NVIDIA A100 80GB SXM datasheet, PCIe Gen4 x16"),
    "L40S": GpuSpec("L40S", 46068 / 1024, 864, 32, 362, "NVIDIA L40S datasheet, PCIe Gen4 x16"),
    "RTX4090": GpuSpec("RTX4090", 24564 / 1024, 1008, 32, 165, "NVIDIA Ada whitepaper (RTX 4090), PCIe Gen4 x16"),
}


def gpu_spec(name: str) -> GpuSpec:
    """The table's entry for `name` (case and '-', ' ' ignored: 'rtx-4090' finds RTX4090)."""
    key = name.upper().replace("-", "").replace(" ", "").replace("_", "")
    for known, spec in GPUS.items():
        if known.upper() == key:
            return spec
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or give --hbm-gbs, --gpu-mem-gib, "
                     "--pcie-gbs and --tflops with --gpu custom)")
