"""Code sent to workers by value (:mod:`aiovec._transport.by_value`): what it keeps, and
what it costs."""

from __future__ import annotations

import linecache
import tracemalloc

import numpy as np

from aiovec._transport import by_value


def test_large_captured_data_is_not_copied_twice():
    """A factory capturing a large array costs about one payload to pickle and to load,
    as plain cloudpickle does (not a second copy for the source lines)."""
    data = np.ones(20_000_000 // 8)  # 20 MB

    def factory():
        return data.sum()

    tracemalloc.start()
    try:
        blob = by_value.dumps(factory)
        _, dump_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        start, _ = tracemalloc.get_traced_memory()
        loaded = by_value.loads(blob)
        _, load_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert loaded() == data.sum()
    assert dump_peak < 1.5 * data.nbytes
    assert load_peak - start < 1.5 * data.nbytes


def test_code_keeps_its_file_and_cell_lines():
    filename = "<aiovec-by-value-cell>"
    source = "def answer():\n    return 42  # from a cell\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__aiovec_cell__"}
    exec(compile(source, filename, "exec"), namespace)
    blob = by_value.dumps(namespace["answer"])
    del linecache.cache[filename]
    answer = by_value.loads(blob)
    assert answer() == 42
    assert answer.__code__.co_filename == filename
    assert "# from a cell" in linecache.getline(filename, 2)
    del linecache.cache[filename]


def test_each_key_unpickles_its_own_copy_of_factories_sent_once():
    """Factories pickled together (one for several envs, or several capturing one
    array) carry the array once, yet every env owns what its factory captured."""
    from functools import partial

    data = np.zeros(100_000)  # 800 kB
    alone = len(by_value.dumps({0: partial(dict, data=data)}))
    same = by_value.dumps(dict.fromkeys(range(8), partial(dict, data=data)))
    distinct = by_value.dumps({key: partial(dict, data=data) for key in range(8)})
    assert len(same) < alone + 1_000 and len(distinct) < alone + 1_000  # 800 kB once
    for blob in (same, distinct):
        factories = by_value.loads_each(blob)
        first, second = factories[0](), factories[1]()
        assert first["data"] is not second["data"]
        first["data"] += 1
        assert second["data"].max() == 0
    assert data.max() == 0


def test_factories_whose_copies_would_be_large_data_are_shared(monkeypatch):
    """Beyond OWN_COPIES_UP_TO bytes of copies (per-env copies of a captured dataset),
    a worker's envs share what their factories captured, as a fork shares it."""
    from functools import partial

    monkeypatch.setattr(by_value, "OWN_COPIES_UP_TO", 100_000)
    data = np.zeros(4_000)  # 32 kB: 4 copies stay within, 8 do not
    for count, shared in ((3, False), (8, True)):
        blob = by_value.dumps({key: partial(dict, x=data) for key in range(count)})
        factories = by_value.loads_each(blob)
        assert (factories[0]()["x"] is factories[1]()["x"]) is shared
