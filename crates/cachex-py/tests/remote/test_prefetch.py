"""Warming ahead of the epoch: ``prefetch`` on the page file and memmap
readers over ``s3://`` (the S3 test server) fills the local tier in the
background and returns a :class:`cachex.Prefetch` at once; the datasets'
``prefetch_epoch`` warms what this rank reads next, in the plan's order,
so that the epoch's reads send no request (counted by a loopback proxy in
front of the server). On a local file ``prefetch`` returns a finished
``Prefetch``. The order warmed is the one the rank reads (hypothesis)."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import multiprocessing as mp
import threading
import time
import urllib.parse
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cachex
import procs
from cachex.sampling import Progress, SamplingPlan
from cachex.torch import datasets as data

# Arrays and page files are read by blocks whatever their size (16 KiB,
# each warmed by a request of its own), and a page file's open fetches its
# header with a read-ahead and its tables at the end: most of their blocks
# are left to warm.
DIM = 4096  # 16 KiB a sample
N = 150  # a 2.4 MiB memmap array
N_PAGES = 450  # a 7.2 MiB page file
PAGE = 1 << 20


def x_of(i: int) -> np.ndarray:
    return np.full(DIM, i, dtype=np.float32)


def write_pages(url, n=N_PAGES, **kw) -> None:
    w = cachex.PageWriter(url, {"i": "int", "x": ("float32", (DIM,))}, page_size=PAGE, **kw)
    w.write_many({"i": i, "x": x_of(i)} for i in range(n))
    w.finalize()


def write_memmap(url, **kw) -> None:
    w = cachex.MemmapWriter(url, {"x": ("float32", (DIM,))}, **kw)
    for i in range(N):
        w.write(f"s{i}", {"x": x_of(i)})
    assert w.finalize() == N


class _Forward(http.server.BaseHTTPRequestHandler):
    """Forwards each request to the S3 test server as it came, and records it."""

    protocol_version = "HTTP/1.1"
    server: _CountingProxy

    def _forward(self) -> None:
        self.server.requests.append((self.command, self.path))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        upstream = http.client.HTTPConnection(*self.server.upstream, timeout=120)
        try:
            upstream.request(self.command, self.path, body=body, headers=dict(self.headers))
            answer = upstream.getresponse()
            payload = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status, answer.reason)
        for k, v in answer.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "date"):
                self.send_header(k, v)
        size = answer.getheader("Content-Length") if self.command == "HEAD" else len(payload)
        self.send_header("Content-Length", str(size or 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward  # noqa: N815 (http.server names)

    def log_message(self, *args: object) -> None:
        pass


class _CountingProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, endpoint: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        parsed = urllib.parse.urlsplit(endpoint)
        self.upstream = (parsed.hostname, parsed.port or 80)
        self.requests: list[tuple[str, str]] = []
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"


@contextlib.contextmanager
def counting_proxy(endpoint: str) -> Iterator[_CountingProxy]:
    """A loopback proxy in front of the S3 test server that records every request."""
    proxy = _CountingProxy(endpoint)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


def ids_of(batches) -> list[int]:
    return [i for b in batches for i in np.asarray(b["i"]).reshape(-1).tolist()]


def test_page_prefetch_epoch_warms_every_page_then_nothing(s3):
    url = s3.url("pages/data.pages")
    write_pages(url, **s3.tier("writer"))
    it = data.PageDataset(url, **s3.tier("reader")).iterable(16, seed=3)
    warming = it.prefetch_epoch()
    assert isinstance(warming, cachex.Prefetch)
    assert warming.wait(120.0) and warming.done
    assert warming.fetched_blocks > 0 and warming.bytes > 0 and warming.failed_blocks == 0
    assert warming.total_blocks >= warming.fetched_blocks
    assert "Prefetch(" in repr(warming)
    # Every sample reads right, from the warmed tier.
    seen = []
    for batch in it:
        for i, x in zip(batch["i"].tolist(), batch["x"], strict=True):
            np.testing.assert_array_equal(x, x_of(i))
            seen.append(i)
    assert sorted(seen) == list(range(N_PAGES))
    # Everything is local now: a second warming fetches nothing.
    again = it.dataset.reader.prefetch(list(range(N_PAGES)))
    assert again.wait(120.0) and again.fetched_blocks == 0 and again.bytes == 0


def test_a_prefetched_epoch_sends_no_request_during_its_reads(s3):
    pages, arrays = s3.url("pages/data.pages"), s3.url("arrays")
    write_pages(pages, **s3.tier("writer"))
    write_memmap(arrays, **s3.tier("writer"))
    with counting_proxy(s3.endpoint) as proxy:
        tier = s3.tier("reader")
        tier["storage_options"]["aws_endpoint"] = proxy.endpoint
        page_it = data.PageDataset(pages, **tier).iterable(32, seed=7)
        memmap_it = data.MemmapDataset(arrays, **tier).iterable(32, seed=7)
        for it in (page_it, memmap_it):
            assert it.prefetch_epoch().wait(120.0)
        warmed = len(proxy.requests)
        assert any(method == "GET" for method, _ in proxy.requests)  # it went through
        seen = ids_of(page_it)
        rows = [r for b in memmap_it for r in np.asarray(b["x"])[:, 0].astype(int).tolist()]
        assert proxy.requests[warmed:] == []  # the epoch read from the tier alone
    assert sorted(seen) == list(range(N_PAGES)) and sorted(rows) == list(range(N))


def test_memmap_prefetch_warms_the_rows_then_nothing(s3):
    url = s3.url("arrays")
    write_memmap(url, **s3.tier("writer"))
    ds = data.MemmapDataset(url, **s3.tier("reader"))
    it = ds.iterable(32, seed=1)
    warming = it.prefetch_epoch(0)
    assert warming is not None and warming.wait(120.0)
    assert warming.fetched_blocks > 0 and warming.failed_blocks == 0
    order = it.rank_order(0)
    assert sorted(order.tolist()) == list(range(N))
    batch = ds[order.tolist()]
    np.testing.assert_array_equal(batch["x"], np.stack([x_of(i) for i in order.tolist()]))
    again = ds.cache.prefetch(order.tolist())
    assert again.wait(120.0) and again.fetched_blocks == 0
    one = ds.cache.prefetch(5)  # a single row still works
    assert one.wait(120.0) and one.fetched_blocks == 0


def _wait_forever(warming: cachex.Prefetch) -> None:
    warming.wait()


def test_wait_with_a_tiny_timeout_returns_and_cancel_ends_the_fill(s3):
    url = s3.url("arrays")
    write_memmap(url, **s3.tier("writer"))
    cache = cachex.MemmapArray(url, **s3.tier("reader"))
    warming = cache.prefetch(list(range(N))[::-1])
    # A forked child has no thread of the fill: its wait does not hang.
    child = mp.get_context("fork").Process(target=_wait_forever, args=(warming,))
    with procs.ended(child, within=120):
        child.start()
    assert child.exitcode == 0
    started = time.monotonic()
    assert warming.wait(0.001) in (True, False)
    assert warming.wait(0) in (True, False)
    # A hang guard, not a speed test: a bounded wait returns.
    assert time.monotonic() - started < 60
    warming.cancel()
    assert warming.wait(120.0) and warming.done
    assert warming.fetched_blocks <= warming.total_blocks
    # Reads fetch what the cancelled fill left.
    for i in (0, N // 2, N - 1):
        np.testing.assert_array_equal(cache.get(i, "x"), x_of(i))
    with pytest.raises(cachex.InvalidInputError, match="timeout"):
        warming.wait(-1.0)
    with pytest.raises(cachex.InvalidInputError, match="timeout"):
        warming.wait(float("nan"))


def test_prefetch_of_a_sample_past_the_end_is_refused(s3):
    url = s3.url("pages/data.pages")
    write_pages(url, 10, **s3.tier("writer"))
    reader = cachex.PageReader(url, **s3.tier("reader"))
    with pytest.raises(IndexError, match="sample 10 out of range"):
        reader.prefetch([0, 10])
    cache_url = s3.url("arrays")
    w = cachex.MemmapWriter(cache_url, {"x": ("float32", (2,))}, **s3.tier("writer"))
    w.write("a", {"x": np.zeros(2, np.float32)})
    w.finalize()
    with pytest.raises(IndexError):
        cachex.MemmapArray(cache_url, **s3.tier("reader")).prefetch([1])


def test_local_prefetch_is_done_at_once(tmp_path):
    write_pages(tmp_path / "a.pages", 20)
    w = cachex.MemmapWriter(tmp_path / "m", {"x": ("float32", (2,))})
    for i in range(5):
        w.write(f"s{i}", {"x": np.zeros(2, np.float32)})
    w.finalize()
    for warming in (
        cachex.PageReader(tmp_path / "a.pages").prefetch([3, 2, 1]),
        cachex.MemmapArray(tmp_path / "m").prefetch([3, 2, 1]),
        cachex.MemmapArray(tmp_path / "m").prefetch(-1),
        data.PageDataset(tmp_path / "a.pages").iterable(8).prefetch_epoch(4),
        # The documented route with a map-style dataset and its sampler.
        data.PageDataset(tmp_path / "a.pages").prefetch(
            data.PageDataset(tmp_path / "a.pages").sampler(4).rank_order(1)
        ),
    ):
        assert isinstance(warming, cachex.Prefetch) and warming.done and warming.wait(0)
        assert (warming.fetched_blocks, warming.bytes, warming.total_blocks) == (0, 0, 0)
    # Datasets that fetch their own way have nothing to warm.
    shards = data.ShardDataset(tmp_path / "sh", lambda: iter(range(5)))
    assert shards.iterable(2).prefetch_epoch() is None


@settings(max_examples=100, deadline=None)
@given(
    blocks=st.lists(st.integers(1, 12), min_size=0, max_size=25),
    seed=st.integers(0, 2**32),
    world=st.integers(1, 4),
    workers=st.integers(1, 4),
    bs=st.integers(1, 9),
    policy=st.sampled_from(["pad", "drop_last"]),
    steps=st.integers(0, 5),
)
def test_rank_order_is_what_the_rank_reads_in_turn(blocks, seed, world, workers, bs, policy, steps):
    """What ``prefetch_epoch`` warms: every batch of the rank, in the order
    its loop receives them (also after a loaded state)."""
    plan = SamplingPlan(blocks, bs, seed=seed, policy=policy)
    start = min(steps * bs * world, plan.num_samples)
    deal = plan.deal(2, world, workers, Progress(2, start, bs * world))
    for rank in range(world):
        parts = [deal.batch(rank, j) for j in range(deal.num_batches)]
        want = np.concatenate(parts).tolist() if parts else []
        assert deal.rank_order(rank).tolist() == want
    sampler = data.PlanSampler(
        blocks, bs, seed=seed, policy=policy, rank=world - 1, world_size=world
    )
    sampler.set_epoch(2)
    assert sampler.rank_order().tolist() == [i for b in sampler for i in b]
    assert sampler.rank_order(5).tolist() == plan.deal(5, world).rank_order(world - 1).tolist()


def test_segment_prefetch_fetches_the_keys_segments_then_the_epoch_sends_no_request(s3):
    url = s3.url("segments")
    with cachex.SegmentStore(url, flush_every=256, **s3.tier("writer")) as store:
        for start in range(0, 2000, 500):
            part = range(start, start + 500)
            store.put_batch({f"k{i}": np.full(64, i, np.float32) for i in part})
    keys = [f"k{(i * 613) % 2000}" for i in range(2000)]  # an epoch's order
    with counting_proxy(s3.endpoint) as proxy:
        tier = s3.tier("reader")
        tier["storage_options"]["aws_endpoint"] = proxy.endpoint
        reader = cachex.SegmentStore(url, read_only=True, **tier)
        warming = reader.prefetch(keys)
        assert isinstance(warming, cachex.Prefetch)
        assert warming.wait(120.0) and warming.done
        assert warming.total_blocks == 8  # whole segments: 2000 keys, 256 a segment
        assert warming.fetched_blocks == 8 and warming.failed_blocks == 0
        warmed = len(proxy.requests)
        for b in range(0, 2000, 250):
            values, missing = reader.get_batch(keys[b : b + 250])
            assert missing == []
            for k, v in zip(keys[b : b + 250], values, strict=True):
                np.testing.assert_array_equal(v, np.full(64, int(k[1:]), np.float32))
        assert proxy.requests[warmed:] == []
        assert reader.prefetch(keys).wait(60.0)
        assert reader.prefetch(keys).total_blocks == 0
    # Through the plan: the dataset warms what this rank reads next.
    ds = data.SegmentDataset(url, keys, read_only=True, **s3.tier("plan"))
    warming = ds.iterable(100, seed=2).prefetch_epoch()
    assert warming is not None and warming.wait(120.0) and warming.fetched_blocks == 8
    # A directory: nothing to fetch, a done Prefetch.
    local = cachex.SegmentStore(str(s3.tmp / "local-seg"))
    local.put_batch({"a": np.zeros(2, np.float32)})
    local.flush()
    done = local.prefetch(["a"])
    assert done.done and done.total_blocks == 0
