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


def test_each_key_unpickles_its_own_copy_of_a_factory_sent_once():
    """One factory given for several envs travels once, yet every env it builds (and
    every later build) owns what the factory captured."""
    from functools import partial

    data = np.zeros(1_000_000)  # 8 MB
    blob = by_value.dumps_each({env_id: partial(dict, data=data) for env_id in range(1)})
    blob_8 = by_value.dumps_each(dict.fromkeys(range(8), partial(dict, data=data)))
    assert len(blob_8) < len(blob) + 1_000  # the 8 MB once, not 8 times
    factories = by_value.loads_each(blob_8)
    first, second, again = factories[0](), factories[1](), factories[0]()
    assert first["data"] is not second["data"] and again["data"] is not first["data"]
    first["data"] += 1
    assert second["data"].max() == 0 and data.max() == 0
