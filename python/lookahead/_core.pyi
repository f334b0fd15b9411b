"""Type stubs of the Rust extension `lookahead._core` (use `lookahead.LookaheadCache`)."""

import os
from typing import Any, final

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

__all__ = [
    "Cache",
    "Draft",
    "_error_kinds",
    "_raise_error",
    "_panic_for_test",
    "_time_index",
    "_time_compaction",
    "Calibration",
    "LearnedCosts",
    "CostGrid",
    "outcomes",
    "DEFAULTS",
    "MAX_BUDGET",
    "MAX_CAPACITY_NODES",
    "MIN_CAPACITY_BYTES",
    "MAX_DEPTH",
    "MAX_IDS_PER_CALL",
    "MAX_INDEX_THREADS",
    "MAX_RECYCLE_K",
    "MAX_RECYCLE_SLOTS",
    "MAX_WEIGHT",
    "MAX_CORPORA",
    "MAX_CORPUS_ID_BYTES",
    "CORPUS_SHARE",
]

# The cache's knobs and their defaults (`Config::default()` in the core): the one source the
# wrapper, the CLI and the SGLang config read.
DEFAULTS: dict[str, Any]
MAX_BUDGET: int
MAX_CAPACITY_NODES: int
MIN_CAPACITY_BYTES: int
MAX_DEPTH: int
MAX_IDS_PER_CALL: int  # token ids one call takes at most (longer inputs: InvalidInput)
MAX_INDEX_THREADS: int
MAX_RECYCLE_K: int
MAX_RECYCLE_SLOTS: int
MAX_WEIGHT: float
MAX_CORPORA: int  # corpora a cache holds at once
MAX_CORPUS_ID_BYTES: int
CORPUS_SHARE: int  # corpora together hold at most capacity_nodes / CORPUS_SHARE nodes

_Rid = int | str | np.integer[Any]
_U32 = npt.NDArray[np.uint32]
# A list/tuple of ints, a 1-D numpy integer array or a 1-D integer torch tensor.
_Tokens = Any

@final
class Draft:
    def __new__(
        cls, tokens: Any, parents: Any, scores: Any, num_nodes: int, matched: Any = None
    ) -> Draft: ...
    @property
    def tokens(self) -> npt.NDArray[np.int32]: ...
    @property
    def parents(self) -> npt.NDArray[np.int32]: ...
    @property
    def scores(self) -> npt.NDArray[np.float32]: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def matched(self) -> npt.NDArray[np.uint8]: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, Any, Any, int, Any]]: ...

@final
class Cache:
    def __new__(
        cls,
        max_depth: int,
        capacity_nodes: int,
        own_weight: float,
        history_weight: float,
        keep_prompt_as_history: bool,
        background_indexing: bool,
        index_threads: int,
        history_skip: tuple[int, int] | None,
        recycle_k: int,
        recycle_slots: int,
        recycle_weight: float,
        corpus_weight: float,
        capacity_bytes: int,
    ) -> Cache: ...
    def config(self) -> dict[str, Any]: ...
    def start_request(self, rid: _Rid, prompt: _Tokens, namespace: str) -> None: ...
    def extend(self, rid: _Rid, tokens: _Tokens) -> None: ...
    def extend_predicted(
        self,
        rid: _Rid,
        tokens: _Tokens,
        ids: _U32,
        probs: npt.NDArray[np.float32],
        k: int,
    ) -> None: ...
    def recycle_after(
        self,
        rid: _Rid,
        toks: _Tokens,
        after: _Tokens | None,
        ids: _U32,
        probs: npt.NDArray[np.float32],
        k: int,
    ) -> None: ...
    def extend_batch(self, rids: list[_Rid], tokens: _Tokens, lengths: list[int]) -> None: ...
    def draft(
        self,
        rid: _Rid,
        budget: int,
        multi_branch: bool,
        vocab: int | None = None,
        max_depth: int | None = None,
    ) -> Draft: ...
    def step(
        self,
        rid: _Rid,
        tokens: _Tokens,
        budget: int,
        multi_branch: bool,
        vocab: int | None = None,
        max_depth: int | None = None,
    ) -> Draft: ...
    def draft_batch(
        self,
        rids: list[_Rid],
        budget: int,
        multi_branch: bool,
        threads: int = 1,
        width: int | None = None,
        pad_parent: int = ...,  # -1 (PyO3 shows a negative default as ...)
    ) -> tuple[
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
        npt.NDArray[np.float32],
        npt.NDArray[np.int32],
        npt.NDArray[np.uint8],
    ]: ...
    def finish_request(self, rid: _Rid, keep_prompt: bool | None = None) -> None: ...
    def add_history(self, corpus: list[_Tokens], namespace: str) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def save(self, path: str | os.PathLike[str], meta: str | None = None) -> None: ...
    def saved_meta(self) -> str | None: ...
    def add_corpus(
        self, id: str, documents: list[_Tokens], scope: str | None = None
    ) -> dict[str, Any]: ...
    def remove_corpus(self, id: str) -> bool: ...
    def move_corpora_to(self, to: Cache) -> list[str]: ...
    def corpora(self) -> list[dict[str, Any]]: ...
    @staticmethod
    def load(
        path: str | os.PathLike[str],
        background_indexing: bool | None = None,
        index_threads: int | None = None,
        allow_legacy: bool = False,
    ) -> Cache: ...
    def check_invariants(self) -> None: ...
    def _time_drafts(
        self, rids: list[_Rid], budget: int, multi_branch: bool, iters: int
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], float]: ...
    def _time_compaction_stall(
        self,
        namespace: str,
        rids: list[_Rid],
        tokens: list[int],
        budget: int,
        mode: str = "beside",
    ) -> tuple[int, int, int, npt.NDArray[np.uint64]]: ...

def _error_kinds() -> list[tuple[str, str]]: ...
def _raise_error(kind: str, message: str) -> None: ...
def _panic_for_test() -> None: ...
def _time_index(tokens: _U32, max_depth: int) -> tuple[int, int, int]: ...
def _time_compaction(tokens: _U32, max_depth: int) -> tuple[int, int, int]: ...

# The acceptance calibration and the cost-aware cut read off it (`lookahead.calibration`,
# `lookahead.sizing`). Ints: int32 / int64 / uint8 arrays or sequences of ints; floats:
# float32 / float64 arrays or sequences of numbers.
_Ints = npt.NDArray[np.int32] | npt.NDArray[np.int64] | npt.NDArray[np.uint8] | list[int]
_Floats = npt.NDArray[np.float32] | npt.NDArray[np.float64] | list[float]

# A native base: `lookahead.calibration.AcceptanceCalibration` extends it.
@disjoint_base
class Calibration:
    def __new__(
        cls, bands: _Floats, groups: _Ints, prior_weight: float, decay: float
    ) -> Calibration: ...
    prior_weight: float
    @property
    def decay(self) -> float: ...
    @property
    def prior(self) -> npt.NDArray[np.float64]: ...
    @property
    def offered(self) -> npt.NDArray[np.float64]: ...
    @property
    def accepted(self) -> npt.NDArray[np.float64]: ...
    def table(self) -> npt.NDArray[np.float64]: ...
    def cells(
        self, cond: _Floats, matched: _Ints
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def predict(self, cond: _Floats, matched: _Ints) -> npt.NDArray[np.float64]: ...
    def observe(
        self, cond: _Floats, matched: _Ints, followed: npt.NDArray[np.bool_] | _Floats
    ) -> None: ...
    def learn(
        self,
        tokens: _Ints,
        parents: _Ints,
        scores: _Floats,
        matched: _Ints,
        path: _Ints,
        emitted: _Ints,
        verified: int | None = None,
    ) -> int: ...
    def expected(
        self, scores: _Floats, parents: _Ints, matched: _Ints
    ) -> npt.NDArray[np.float64]: ...
    def choose(
        self,
        scores: _Floats,
        parents: _Ints,
        matched: _Ints,
        costs: npt.NDArray[np.float64],
        host_s: float,
        switch_s: float,
    ) -> int: ...

# A measured forward-cost curve (`lookahead.costs.CostModel` reads it).
@final
class CostGrid:
    def __new__(cls, widths: _Ints, contexts: _Ints, seconds: _Floats) -> CostGrid: ...
    def curve(self, context_len: int) -> npt.NDArray[np.float64]: ...

# What verify forwards cost, learnt (`lookahead.learned_costs.LearnedCosts` extends it).
@disjoint_base
class LearnedCosts:
    def __new__(
        cls,
        prior: CostGrid,
        bands: _Ints,
        window: int,
        prior_count: float,
        switch_base: int,
        settle: int,
        switches: bool,
    ) -> LearnedCosts: ...
    @property
    def max_rows(self) -> int: ...
    @property
    def window(self) -> int: ...
    switches: bool
    @property
    def count(self) -> int: ...
    @property
    def switch_frac(self) -> float: ...
    @property
    def switches_kept(self) -> int: ...
    def band(self, context_len: int) -> int: ...
    def observe(self, rows: int, context_len: int, seconds: float) -> None: ...
    def gap(self) -> None: ...
    def curve(self, context_len: int) -> npt.NDArray[np.float64]: ...
    def measured(self, context_len: int) -> list[tuple[int, float, int]]: ...

def outcomes(
    tokens: _Ints, parents: _Ints, path: _Ints, emitted: _Ints, verified: int | None = None
) -> tuple[list[int], list[float]]: ...
