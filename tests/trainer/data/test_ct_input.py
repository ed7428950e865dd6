"""The CT input: the order is the seed's alone, a share is a slice of the whole, the cache changes nothing but speed."""

import concurrent.futures
import threading
import time

import numpy as np
import pytest

from preprocessing.records import tfrecord_files, tfrecord_schema
from trainer.data import batches, ct_batches, ct_input, decoded_cache


def _take(stream, steps):
    """(ids, image, label, scale) of `steps` batches, copied out and released."""
    taken = []
    for _ in range(steps):
        batch = next(stream)
        taken.append((list(batch.ids), batch.inputs["image"].copy(), batch.labels.copy(), batch.inputs["scale"].copy()))
        batch.release()
    stream.close()
    return taken


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """5 CT records of 16 x 6 x 4 in two files (16 deep: 16 slabs of 1)."""
    folder = tmp_path_factory.mktemp("ct")
    rng = np.random.default_rng(0)
    examples = [tfrecord_schema.encode_ct_example(tfrecord_schema.CtRecord(
        f"case{i}", "p", rng.normal(size=(16, 6, 4)).astype(np.float32),
        rng.integers(0, 3, (16, 6, 4)).astype(np.uint8))) for i in range(5)]
    tfrecord_files.write_records(str(folder / "data-00000-of-00002.tfrecord"), examples[:3])
    tfrecord_files.write_records(str(folder / "data-00001-of-00002.tfrecord"), examples[3:])
    return ct_input.CtRecords(str(folder / "data-*"))


def test_the_order_is_a_function_of_seed_and_position(records):
    whole = _take(ct_batches.CtBatches(records, 2, seed=3), 6)  # 12 positions: 2 epochs and more of 5 examples
    ids = [case for batch in whole for case in batch[0]]
    for epoch in range(2):  # every epoch holds each example once, in its seed's own order
        assert sorted(ids[5 * epoch:5 * epoch + 5]) == [f"case{i}" for i in range(5)]
    assert ids[:5] != ids[5:10]
    resumed = _take(ct_batches.CtBatches(records, 2, seed=3, start_step=4), 2)  # a resumed run starts at its step
    for (a_ids, a_image, a_label, _), (b_ids, b_image, b_label, _) in zip(whole[4:], resumed):
        assert a_ids == b_ids
        np.testing.assert_array_equal(a_image, b_image)
        np.testing.assert_array_equal(a_label, b_label)
    assert [b[0] for b in _take(ct_batches.CtBatches(records, 2, seed=4), 3)] != [b[0] for b in whole[:3]]


@pytest.mark.parametrize("share", [batches.Share((0, 2)), batches.Share((1,)), batches.Share((0, 1, 2), (4, 12)),
                                   batches.Share((2,), (15, 16))])
@pytest.mark.parametrize("cache", ["off", "on"])
def test_a_share_is_exactly_its_rows_and_depths_of_the_whole_batch(records, share, cache):
    whole = _take(ct_batches.CtBatches(records, 3, seed=1, start_step=2), 4)
    part = _take(ct_batches.CtBatches(records, 3, share, seed=1, start_step=2, cache=cache), 4)
    start, stop = share.depth_of(16)
    rows = list(share.rows)
    for full, mine in zip(whole, part):
        assert mine[0] == [full[0][r] for r in rows]
        np.testing.assert_array_equal(mine[1], full[1][rows, start:stop])
        np.testing.assert_array_equal(mine[2], full[2][rows, start:stop])
        np.testing.assert_array_equal(mine[3], full[3][rows])


def test_the_cache_is_filled_once_and_then_read(records, monkeypatch):
    stream = ct_batches.CtBatches(records, 1, seed=0, cache="on")
    reads = []
    original = ct_input.CtRecords.read
    monkeypatch.setattr(ct_input.CtRecords, "read", lambda self, index, *rest: (reads.append(index),
                                                                                 original(self, index, *rest)))
    taken = _take(stream, 15)  # 3 epochs of 5
    assert stream.cached and sorted(set(reads)) == list(range(5))
    assert len(reads) == 5 * stream._cuts  # each example's pieces read once, in the first epoch only
    uncached = _take(ct_batches.CtBatches(records, 1, seed=0, cache="off"), 15)
    for a, b in zip(taken, uncached):
        assert a[0] == b[0]
        np.testing.assert_array_equal(a[1], b[1])


def _fill_from_two_threads(fails: bool):
    """Thread one fills depths 0-4 of example 0 (its read failing if `fails`); thread two needs 1-3 meanwhile."""
    cache = decoded_cache.DecodedCache(4, (2, 2))
    reads, reading, go = [], threading.Event(), threading.Event()

    def read(low, high, image, label):
        reads.append((low, high))
        if len(reads) == 1:
            reading.set()
            assert go.wait(10)
            if fails:
                raise OSError("disk gone")
        image[...], label[...] = 7, 1

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(cache.fill, 0, 0, 4, read)
        assert reading.wait(10)
        second = pool.submit(cache.fill, 0, 1, 3, read)
        time.sleep(0.2)  # the second thread finds depths 1-3 being read
        go.set()
        image, label = second.result(10)
    assert (image[1:3] == 7).all() and (label[1:3] == 1).all()
    return reads, first


def test_depths_another_thread_is_reading_are_waited_for_not_read_again():
    reads, first = _fill_from_two_threads(fails=False)
    assert reads == [(0, 4)] and (first.result()[0] == 7).all()


def test_depths_filled_between_a_threads_look_and_its_lock_are_not_waited_for():
    """Before: a thread that saw depths unfilled, then took the lock after their reader had filled them and notified,
    waited for a notice that never came, and training hung (the suite's fused-norm run did, 2026-12-07)."""
    cache = decoded_cache.DecodedCache(4, (2, 2))
    reading, go = threading.Event(), threading.Event()

    def read(low, high, image, label):
        reading.set()
        assert go.wait(10)
        image[...], label[...] = 7, 1

    first = threading.Thread(target=cache.fill, args=(0, 0, 4, read), daemon=True)
    first.start()
    assert reading.wait(10)
    condition = cache._changed

    class FirstReaderFinishesBeforeTheLock:
        """The cache's condition, but the second thread's first entry waits until the first reader is done."""

        entered = False

        def __enter__(self):
            if not self.entered and threading.current_thread() is not first:
                self.entered = True
                go.set()
                first.join(10)
            return condition.__enter__()

        def __exit__(self, *exc):
            return condition.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(condition, name)

    cache._changed = FirstReaderFinishesBeforeTheLock()
    found = []
    second = threading.Thread(target=lambda: found.append(cache.fill(0, 1, 3, read)), daemon=True)
    second.start()
    second.join(10)
    assert not first.is_alive() and not second.is_alive(), "the second thread waits for depths already filled"
    image, label = found[0]
    assert (image[1:3] == 7).all() and (label[1:3] == 1).all()


def test_depths_whose_read_failed_are_read_by_the_thread_that_waited():
    reads, first = _fill_from_two_threads(fails=True)
    assert reads == [(0, 4), (1, 3)]
    with pytest.raises(OSError, match="disk gone"):
        first.result()


def test_released_buffers_are_reused_not_reallocated(records, monkeypatch):
    made = []
    stream = ct_batches.CtBatches(records, 2, seed=0)
    original = stream._new_buffer
    monkeypatch.setattr(stream, "_new_buffer", lambda: made.append(1) or original())
    stream._prefetcher._new_buffer = stream._new_buffer
    for _ in range(20):
        next(stream).release()
    stream.close()
    assert 1 <= len(made) <= 3  # the steps ahead and the one in hand, not one per step


@pytest.mark.parametrize("mode, needed, available, expected", [
    ("auto", 2**30, 8 * 2**30, True), ("auto", 5 * 2**30, 8 * 2**30, False), ("auto", 1, None, False),
    ("on", 10 * 2**30, 2**30, True), ("off", 1, 8 * 2**30, False)])
def test_the_cache_decision_and_its_reason(mode, needed, available, expected):
    chosen, reason = decoded_cache.choose_cache(mode, needed, available)
    assert chosen is expected and reason.startswith("on" if expected else "off")


def test_reads_and_decodes_use_every_usable_core(records):
    stream = ct_batches.CtBatches(records, 1, seed=0, workers=2)
    assert stream._cuts == 2  # one example a step is read as 2 depth ranges, one per worker
    assert sorted(piece[1:] for piece in stream._pieces([(0, (0, 0, 0))])) == [(0, 8), (8, 16)]
    stream.close()


def test_each_record_s_layout_is_read_once_for_the_order_and_every_use(records, monkeypatch):
    """Opening reads each record's layout for its case id; using the records reads none again (they were read twice:
    once at open, dropped, then again when first needed)."""
    from preprocessing.records import ct_slabs

    reads = []
    read_layout = ct_slabs.read_layout
    monkeypatch.setattr(ct_slabs, "read_layout", lambda file, number: reads.append(number) or read_layout(file, number))
    opened = ct_input.CtRecords(records.pattern)
    assert len(reads) == len(opened) == 5
    assert [opened.layout(i).case_id for i in range(len(opened))] == [f"case{i}" for i in range(5)]
    image, label = np.empty((2, 6, 4, 1), opened.stored), np.empty((2, 6, 4), np.uint8)
    opened.read(4, 0, 2, image, label)
    assert len(reads) == 5
    opened.close()


def test_a_record_of_another_shape_is_named_when_it_is_first_used(tmp_path):
    rng = np.random.default_rng(1)
    examples = [tfrecord_schema.encode_ct_example(tfrecord_schema.CtRecord(
        name, "p", rng.normal(size=shape).astype(np.float32), np.zeros(shape, np.uint8)))
        for name, shape in (("a", (4, 6, 4)), ("b", (4, 8, 4)))]
    tfrecord_files.write_records(str(tmp_path / "data-00000-of-00001.tfrecord"), examples)
    opened = ct_input.CtRecords(str(tmp_path / "data-*"))
    assert opened.shape == (4, 6, 4)  # opening and the first record say nothing
    with pytest.raises(ValueError, match=r"case b is 4x8x4 voxels but the data set's first is 4x6x4"):
        opened.layout(1)
    opened.close()
