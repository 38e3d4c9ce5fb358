"""A stand-in for torch.cuda.cudart() on a machine without a GPU: it records the page-locking calls and checks what
a real runtime would need (the range is mapped when it is registered and still mapped when it is unregistered)."""

from pathlib import Path

ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered
NOT_REGISTERED = 713  # cudaErrorHostMemoryNotRegistered


def mapped(address: int, nbytes: int) -> bool:
    """Whether [address, address + nbytes) lies in mappings of this process (/proc/self/maps)."""
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        spans.append((lo, hi))
    end, cursor = address + nbytes, address
    for lo, hi in sorted(spans):
        if lo <= cursor < hi:
            cursor = hi
            if cursor >= end:
                return True
    return False


class FakeCudart:
    """Records ("register", address, nbytes, flags) and ("unregister", address, still mapped); fails every
    register with `fail_with` when it is non-zero."""

    def __init__(self, fail_with: int = 0):
        self.calls: list[tuple] = []
        self.registered: dict[int, int] = {}
        self.fail_with = fail_with

    def cudaHostRegister(self, address, nbytes, flags):
        self.calls.append(("register", address, nbytes, flags))
        if self.fail_with:
            return self.fail_with
        if address in self.registered:
            return ALREADY_REGISTERED
        assert mapped(address, nbytes), "registering memory that is not mapped"
        self.registered[address] = nbytes
        return 0

    def cudaHostUnregister(self, address):
        self.calls.append(("unregister", address, mapped(address, self.registered.get(address, 1))))
        return 0 if self.registered.pop(address, None) is not None else NOT_REGISTERED

    def cudaGetErrorString(self, error):
        return f"fake error {int(error)}"

    def of(self, kind: str) -> list[tuple]:
        return [call for call in self.calls if call[0] == kind]
