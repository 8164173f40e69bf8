"""Datasets the workers can import (a test module's local classes can't be sent to them)."""

from __future__ import annotations


class BadAt:
    """Eight items of Ex (x: [4], y: Index[3]); item `bad` has an x of 3 values."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return {"x": [float(i)] * (3 if i == self.bad else 4), "y": i % 3}


class Rows:
    """`n` items of Ex as plain Python records (not a TensorDataset): loaded item by item."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"x": [((i * 7 + j * 3) % 11) / 5.0 - 1.0 for j in range(4)], "y": (i * 5) % 3}


class Sequences:
    """`n` items of Seq (tokens and targets: [n] Index[6]) of lengths 1 to 7, loaded item by item: each
    batch is padded to its longest item."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        tokens = [(i * 3 + j * 5) % 6 for j in range(1 + (i * 5) % 7)]
        return {"tokens": tokens, "targets": tokens[1:] + [i % 6]}


class RowsBadAt(Rows):
    """`n` items as Rows has them, but item `bad` has an x of 3 values: the batch holding it fails
    to load, on every worker (they agree before the step)."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> dict:
        item = super().__getitem__(i)
        return {**item, "x": item["x"][:3]} if i == self.bad else item


class RowsBadLabelAt(Rows):
    """`n` items as Rows has them, but item `bad` has a label of 7, outside Index[3]: a DomainError
    as the batch holding it loads."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> dict:
        item = super().__getitem__(i)
        return {**item, "y": 7} if i == self.bad else item


class CountedRows(Rows):
    """Rows that count how often they are pickled in this process (`PICKLED`, by the class): each time
    the controller sends one to the workers it pickles it; the workers' copies count in theirs."""

    PICKLED = 0

    def __getstate__(self) -> dict:
        type(self).PICKLED += 1
        return dict(self.__dict__)
