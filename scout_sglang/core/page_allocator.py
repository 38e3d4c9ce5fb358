"""Page allocator: a free list of fixed-size pages and each request's page table.

Used for the host store (every full block of every layer) and the device
resident buffers. Pages are the HND pages of scout_sglang.layout; a request's
logical block j lives in page `table(request)[j]`. Host-side bookkeeping only:
it never touches tensors, so it is cheap, exact, and checkable for leaks.
"""

from __future__ import annotations


class OutOfPagesError(RuntimeError):
    """Raised when an allocation asks for more pages than are free."""


class PageAllocator:
    """Hands out page ids in [0, num_pages) to requests; frees them on release.

    Parameters
    ----------
    num_pages : total pages of the store
    name : shown in errors and usage reports ("host", "device resident")
    """

    def __init__(self, num_pages: int, *, name: str = "pages"):
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.num_pages = num_pages
        self.name = name
        # Lowest ids first: requests admitted in order get ascending pages,
        # which keeps host reads sequential in the common case.
        self._free = list(range(num_pages - 1, -1, -1))
        self._tables: dict[int, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def requests(self) -> list[int]:
        return list(self._tables)

    def count(self, request_id: int) -> int:
        """Pages a request holds (no copy of its table)."""
        return len(self._tables.get(request_id, ()))

    def table(self, request_id: int) -> list[int]:
        """Page ids of a request's logical blocks, in order (a copy)."""
        return list(self._tables.get(request_id, ()))

    def allocate(self, request_id: int, count: int) -> list[int]:
        """Append `count` pages to a request's table; all or nothing."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if count > len(self._free):
            raise OutOfPagesError(
                f"{self.name}: request {request_id} needs {count} pages, {len(self._free)} of {self.num_pages} free"
            )
        pages = [self._free.pop() for _ in range(count)]
        self._tables.setdefault(request_id, []).extend(pages)
        return pages

    def release_last(self, request_id: int, count: int) -> list[int]:
        """Free the last `count` pages of a request's table (a quota that shrinks); returns them."""
        pages = self._tables.get(request_id, [])
        if not 0 <= count <= len(pages):
            raise ValueError(f"{self.name}: request {request_id} holds {len(pages)} pages, {count} cannot be freed")
        freed = pages[len(pages) - count:]
        del pages[len(pages) - count:]
        self._free.extend(reversed(freed))
        return freed

    def allocate_first(self, request_id: int, count: int) -> list[int]:
        """Put `count` pages before a request's others (a resident row's first columns); all or nothing."""
        pages = self.allocate(request_id, count)
        table = self._tables[request_id]
        table[:] = table[len(table) - count:] + table[:len(table) - count]
        return pages

    def transfer_first(self, request_id: int, count: int, to: int) -> list[int]:
        """Move the first `count` pages of a request's table to the end of `to`'s (a resident row's first columns
        that become a shared prefix's pages); returns them."""
        pages = self._tables.get(request_id, [])
        if not 0 <= count <= len(pages):
            raise ValueError(f"{self.name}: request {request_id} holds {len(pages)} pages, {count} cannot move")
        moved = pages[:count]
        del pages[:count]
        self._tables.setdefault(to, []).extend(moved)
        return moved

    def release_pages(self, request_id: int, released: list[int]) -> None:
        """Free these pages of a request's table, wherever they are in it."""
        if not released:
            return
        pages = self._tables.get(request_id, [])
        gone = set(released)
        if len(gone) != len(released) or not gone <= set(pages):
            raise ValueError(f"{self.name}: request {request_id} does not hold every page of {released}")
        pages[:] = [p for p in pages if p not in gone]
        self._free.extend(reversed(released))

    def release(self, request_id: int) -> int:
        """Free every page of a request; returns how many. Unknown ids free nothing."""
        pages = self._tables.pop(request_id, [])
        self._free.extend(reversed(pages))
        return len(pages)

    def check_consistent(self) -> None:
        """Assert that every page is either free or owned by exactly one request."""
        owned = [p for pages in self._tables.values() for p in pages]
        everything = sorted(owned + self._free)
        assert everything == list(range(self.num_pages)), f"{self.name}: pages lost or duplicated"

    def __repr__(self) -> str:
        return f"PageAllocator({self.name}: {self.num_used}/{self.num_pages} used by {len(self._tables)} requests)"
