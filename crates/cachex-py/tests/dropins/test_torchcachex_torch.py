"""``cachex.torchcachex.CacheModuleDecorator`` and torch values (needs torch).

``scripts/test`` installs the pinned torch into its venv and runs these.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test installs it)")
nn = torch.nn

from cachex.torchcachex import ArrowIPCCacheBackend, CacheModuleDecorator  # noqa: E402

TORCH_DTYPES = [
    torch.float16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.bfloat16,
]


class Doubler(nn.Module):
    """Stateless: records the rows it was called with."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.clone())
        return x * 2


class DictOut(nn.Module):
    def forward(self, x: torch.Tensor) -> dict:
        return {"features": x * 3, "logits": x[:, :2].to(torch.float16)}


def backend(tmp_path, **kw) -> ArrowIPCCacheBackend:
    return ArrowIPCCacheBackend(tmp_path, "feat", **kw)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_every_torch_dtype_round_trips_as_that_dtype(tmp_path, dtype):
    want = {f"k{i}": (torch.arange(12) % 3 + i).to(dtype).reshape(3, 4) for i in range(4)}
    b = backend(tmp_path)
    b.put_batch(want)
    b.close()
    values, missing = backend(tmp_path).get_batch(list(want))
    assert missing == []
    for got, w in zip(values, want.values(), strict=True):
        assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.device.type == "cpu"
        assert torch.equal(got, w)


def test_gpu_style_inputs_are_detached_before_storing(tmp_path):
    b = backend(tmp_path)
    x = torch.ones(3, requires_grad=True) * 2
    b.put_batch({"k": x})
    b.close()
    (got,), _ = backend(tmp_path).get_batch(["k"])
    assert not got.requires_grad and torch.equal(got, torch.full((3,), 2.0))


def test_first_call_computes_second_call_reads(tmp_path):
    m = Doubler()
    cached = CacheModuleDecorator(m, backend(tmp_path))
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    ids = ["a", "b", "c", "d"]
    first = cached(x, cache_ids=ids)
    assert torch.equal(first, x * 2) and len(m.calls) == 1
    second = cached(x, cache_ids=ids)
    assert torch.equal(second, x * 2) and len(m.calls) == 1
    assert second.device == x.device


def test_partial_hits_compute_only_the_missing_rows_in_input_order(tmp_path):
    m = Doubler()
    cached = CacheModuleDecorator(m, backend(tmp_path))
    x = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    cached(x[[1, 3]], cache_ids=["b", "d"])
    out = cached(x, cache_ids=["a", "b", "c", "d"])
    assert torch.equal(out, x * 2)
    assert torch.equal(m.calls[-1], x[[0, 2]])  # only the misses ran


def test_hits_survive_a_reopen_and_tensor_cache_ids_work(tmp_path):
    x = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    b = backend(tmp_path)
    CacheModuleDecorator(Doubler(), b)(x, cache_ids=torch.tensor([10, 11, 12]))
    b.close()
    m = Doubler()
    out = CacheModuleDecorator(m, backend(tmp_path))(x, cache_ids=[10, 11, 12])
    assert torch.equal(out, x * 2) and m.calls == []


def test_cache_ids_in_a_batch_dict_and_whole_batch_outputs_by_position(tmp_path):
    class FromDict(nn.Module):
        def forward(self, batch: dict) -> torch.Tensor:
            return batch["x"] + 1

    cached = CacheModuleDecorator(FromDict(), backend(tmp_path))
    x = torch.arange(4, dtype=torch.float32).reshape(4, 1)
    cached({"x": x[[2]], "cache_ids": ["c"]})
    out = cached({"x": x, "cache_ids": ["a", "b", "c", "d"]})
    assert torch.equal(out, x + 1)
    # torchcachex cached output row j (of the misses) under miss j's key.
    (b_val,), _ = cached.cache.get_batch(["b"])
    assert torch.equal(b_val, x[1] + 1)


def test_key_from_batch_fn_and_missing_ids(tmp_path):
    cached = CacheModuleDecorator(
        Doubler(), backend(tmp_path), key_from_batch_fn=lambda x: [f"r{int(v)}" for v in x[:, 0]]
    )
    x = torch.arange(4, dtype=torch.float32).reshape(2, 2)
    assert torch.equal(cached(x), x * 2)
    _, missing = cached.cache.get_batch(["r0", "r2"])
    assert missing == []
    plain = CacheModuleDecorator(Doubler(), backend(tmp_path / "other"))
    with pytest.raises(ValueError, match="cache_ids"):
        plain(x)


def test_disabled_runs_the_module_and_caches_nothing(tmp_path):
    m = Doubler()
    cached = CacheModuleDecorator(m, backend(tmp_path), enabled=False)
    x = torch.ones(2, 2)
    assert torch.equal(cached(x, cache_ids=["a", "b"]), x * 2)
    _, missing = cached.cache.get_batch(["a", "b"])
    assert missing == [0, 1]


def test_stateless_enforcement(tmp_path):
    lin = nn.Linear(2, 2)
    cached = CacheModuleDecorator(lin, backend(tmp_path))
    x = torch.ones(1, 2)
    with pytest.raises(RuntimeError, match="trainable parameters"):
        cached(x, cache_ids=["a"])
    cached.eval()
    cached(x, cache_ids=["a"])
    loose = CacheModuleDecorator(
        nn.Linear(2, 2), backend(tmp_path / "loose"), enforce_stateless=False
    )
    loose(x, cache_ids=["a"])


def test_state_dict_is_the_wrapped_module_s(tmp_path):
    lin = nn.Linear(3, 2)
    cached = CacheModuleDecorator(lin, backend(tmp_path))
    sd = cached.state_dict()
    assert sd.keys() == lin.state_dict().keys()
    other = nn.Linear(3, 2)
    CacheModuleDecorator(other, backend(tmp_path / "o")).load_state_dict(sd)
    assert torch.equal(other.weight, lin.weight)


def test_dict_outputs_and_variable_shapes(tmp_path):
    cached = CacheModuleDecorator(DictOut(), backend(tmp_path))
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    cached(x[:2], cache_ids=["a", "b"])
    out = cached(x, cache_ids=["a", "b", "c", "d"])
    assert torch.equal(out["features"], x * 3)
    assert out["logits"].dtype == torch.float16 and out["logits"].shape == (4, 2)

    b = backend(tmp_path / "var")
    b.put_batch({"s": torch.zeros(2), "l": torch.zeros(5)})
    m = Doubler()
    res = CacheModuleDecorator(m, b)(torch.zeros(2, 2), cache_ids=["s", "l"])
    assert isinstance(res, list) and [t.shape[0] for t in res] == [2, 5]


def test_outputs_land_on_the_input_s_device(tmp_path):
    cached = CacheModuleDecorator(Doubler(), backend(tmp_path))
    x = torch.ones(2, 2, dtype=torch.float64)
    cached(x, cache_ids=["a", "b"])
    out = cached(x, cache_ids=["a", "b"])
    assert out.device == x.device and out.dtype == torch.float64
    if torch.cuda.is_available():  # pragma: no cover - no GPU on CI
        xg = x.cuda()
        assert cached(xg, cache_ids=["a", "b"]).device == xg.device


# Reads decode a batch with one get_stacked call and one unbind per part;
# these pin what that must keep: every structure, dtype and missing key
# as a per-value read gives, and values that do not alias each other.
STRUCTURES = {
    "tensor": lambda i: torch.full((3, 2), float(i)),
    "bf16": lambda i: torch.full((4,), float(i), dtype=torch.bfloat16),
    "dict": lambda i: {
        "features": torch.arange(4, dtype=torch.float32) + i,
        "logits": torch.full((2,), i, dtype=torch.float16),
        "label": f"label-{i}",
    },
    "tuple": lambda i: (torch.tensor([i, i + 1]), {"note": i}),
    "list": lambda i: [torch.tensor([float(i)]), torch.zeros(2, dtype=torch.int8) + i],
    "blob": lambda i: {"a python object", i},
}


def _assert_same(got, want):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
        assert torch.equal(got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for k in want:
            _assert_same(got[k], want[k])
    elif isinstance(want, tuple | list):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w)
    else:
        assert got == want


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_batched_reads_give_every_structure_with_missing_keys(tmp_path, structure):
    make = STRUCTURES[structure]
    b = backend(tmp_path)
    b.put_batch({f"k{i}": make(i) for i in range(6)})
    b.close()
    reader = backend(tmp_path, lru_size=0)
    keys = ["k4", "nope", "k0", "k4", "k5", "also-nope"]
    values, missing = reader.get_batch(keys)
    assert missing == [1, 5]
    assert values[1] is None and values[5] is None
    for k, got in zip(keys, values, strict=True):
        if got is not None:
            _assert_same(got, make(int(k[1:])))
    none, missing = reader.get_batch(["x", "y"])
    assert none == [None, None] and missing == [0, 1]


def test_values_of_one_batch_are_independent_and_writable(tmp_path):
    b = backend(tmp_path)
    b.put_batch({f"k{i}": {"f": torch.full((4,), float(i))} for i in range(3)})
    b.close()
    reader = backend(tmp_path, lru_size=0)
    values, _ = reader.get_batch(["k0", "k1", "k1"])
    values[0]["f"] += 100  # in place, on one value
    values[1]["f"].zero_()
    assert torch.equal(values[2]["f"], torch.full((4,), 1.0))  # the same key, its own tensor
    again, _ = reader.get_batch(["k0", "k1"])
    assert torch.equal(again[0]["f"], torch.zeros(4)) and torch.equal(again[1]["f"], torch.ones(4))


def test_variable_shapes_on_disk_are_read_per_value(tmp_path):
    b = backend(tmp_path)
    b.put_batch({"s": torch.zeros(2), "l": torch.ones(5)})
    b.put_batch({"m": torch.ones(5)})
    b.close()
    reader = backend(tmp_path, lru_size=0)
    values, missing = reader.get_batch(["l", "s", "gone", "m"])
    assert missing == [2]
    assert [v.shape[0] for v in (values[0], values[1], values[3])] == [5, 2, 5]
    assert torch.equal(values[0], torch.ones(5)) and torch.equal(values[1], torch.zeros(2))
    values, _ = reader.get_batch(["l", "m"])  # same shapes, after a batch that differed
    assert torch.equal(torch.stack(values), torch.ones(2, 5))


class Reshaper(nn.Module):
    """Per-sample outputs of rank 1 for a 2-column batch, rank 2 for a 4-column one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.shape[1] == 2 else x.reshape(len(x), 2, 2)


def test_a_module_whose_outputs_change_rank_caches_every_one(tmp_path):
    # torchcachex keeps a shape per row: a cache holds outputs of any rank.
    cached = CacheModuleDecorator(Reshaper(), backend(tmp_path, lru_size=0))
    flat, square = torch.ones(2, 2), torch.arange(8.0).reshape(2, 4)
    cached(flat, cache_ids=["f0", "f1"])
    cached(square, cache_ids=["q0", "q1"])
    cached.cache.close()
    reader = CacheModuleDecorator(Reshaper(), backend(tmp_path, lru_size=0))
    out = reader(torch.zeros(4, 2), cache_ids=["f0", "q1", "q0", "f1"])
    assert isinstance(out, list) and [tuple(t.shape) for t in out] == [(2,), (2, 2), (2, 2), (2,)]
    assert torch.equal(out[1], square[1].reshape(2, 2)) and torch.equal(out[3], flat[1])
