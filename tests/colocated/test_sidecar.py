"""Sidecars: functions run colocated with each slice (jax colocated_python on CPU devices).

In-process tests use the embedded local:2x4 backend; the kernel tests drive
``%%pathways sidecar`` through a real `pathways` kernel, and the notebook
test executes notebooks/sidecar.ipynb with nbclient.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import pathways_kernel as pw
from notebooks import code_cells, execute, outputs_text
from pathways_kernel.colocated.activity import stats
from pathways_kernel.emulator.faults import fail_slice, repair_slice


def test_runs_on_every_slice_and_returns_arrays_on_that_slice(local_session):
    @pw.sidecar
    def shard_info(n, slice_index):
        return {"rows": np.arange(n) + 100 * slice_index, "slice": slice_index}

    results = shard_info(3)
    assert sorted(results) == [0, 1]
    for index, out in results.items():
        assert np.asarray(out["rows"]).tolist() == [100 * index, 100 * index + 1, 100 * index + 2]
        assert int(out["slice"]) == index
        assert out["rows"].devices() == set(local_session.topology.slice(index).devices)


def test_chosen_slices_only(local_session):
    results = pw.run_sidecar(lambda slice_index: slice_index * 2, slices="1")
    assert list(results) == [1]
    assert int(results[1]) == 2
    assert "slice 1: Array(2" in repr(results)


def test_an_exception_comes_back_naming_the_slice(local_session):
    @pw.sidecar
    def fragile(slice_index):
        if slice_index == 1:
            raise KeyError("no shard file for this host")
        return 0

    with pytest.raises(pw.SidecarError) as caught:
        fragile()
    message = str(caught.value)
    assert "\n" not in message
    assert "sidecar 'fragile' failed on slice 1" in message
    assert "KeyError" in message and "no shard file for this host" in message
    assert stats()["slices"][1]["errors"] >= 1
    assert pw.events(kind="sidecar")[-1].detail == message


def test_a_hanging_sidecar_times_out_and_the_next_call_works(local_session):
    hang = {"on": True}

    @pw.sidecar(timeout=1.5)
    def stuck(slice_index):
        if slice_index == 0 and hang["on"]:
            time.sleep(6)  # well past the timeout, short enough not to outlive the module
        return slice_index

    started = time.monotonic()
    with pytest.raises(pw.SidecarTimeout, match=r"sidecar 'stuck' on slice 0 did not finish within 1.5 s"):
        stuck()
    assert time.monotonic() - started < 10
    assert stats()["timeouts"] >= 1
    hang["on"] = False
    assert sorted(int(v) for v in stuck().values()) == [0, 1]


def test_bad_slice_choices_are_one_line_errors(local_session):
    with pytest.raises(pw.PathwaysError, match="no slice 7"):
        pw.run_sidecar(lambda: 0, slices="7")
    with pytest.raises(pw.PathwaysError, match="bad --slices"):
        pw.sidecar(lambda: 0, slices="one")
    fail_slice(1)
    try:
        with pytest.raises(pw.PathwaysError, match="slice 1 is down"):
            pw.run_sidecar(lambda: 0, slices=[1])
        assert list(pw.run_sidecar(lambda: 0)) == [0]  # "all" means the live ones
    finally:
        repair_slice(1)


def test_stats_are_what_the_monitor_reads(local_session):
    pw.run_sidecar(lambda: np.zeros(256, np.float32))
    s = pw.sidecar.stats()
    assert {"calls", "bytes", "busy_s", "errors", "timeouts", "queue_depth", "slices", "loaders"} <= set(s)
    assert s["calls"] >= 2 and s["bytes"] >= 2 * 1024
    event = pw.events(kind="sidecar")[-1]
    assert event.bytes == 2 * 1024 and event.detail == "<lambda> on slices [0,1]"


@pytest.mark.serial  # timing: two 3 s sidecars must finish within 5 s
def test_sidecars_of_different_slices_run_at_the_same_time(local_session):
    """Issue 22.5: the first call ran slice 1 after slice 0 (6 s for two 3 s sidecars), and
    slice 1's busy time counted its wait as running (6 s)."""
    before = stats()["slices"]

    @pw.sidecar
    def nap(slice_index):
        time.sleep(3)
        return slice_index

    started = time.monotonic()
    assert sorted(int(v) for v in nap().values()) == [0, 1]
    took = time.monotonic() - started
    assert took < 5.0, f"two 3 s sidecars on two slices took {took:.1f} s"
    after = stats()["slices"]
    for index in (0, 1):
        busy = after[index]["busy_s"] - before.get(index, {"busy_s": 0.0})["busy_s"]
        assert 2.9 <= busy < 4.5, (index, busy)


# -- through a real kernel ------------------------------------------------------


@pytest.mark.kernel
def test_cell_magic_defines_sidecars_for_the_chosen_slices(kernel):
    reply = kernel.run(
        "%%pathways sidecar --slices 1 --timeout 5\n"
        "import numpy as np\n"
        "@pw.sidecar\n"
        "def host_rows(n, slice_index):\n"
        "    print(f'reading {n} rows on slice {slice_index}')\n"
        "    return np.full(n, slice_index)\n"
    )
    assert reply.status == "ok", reply.error
    assert "<sidecar host_rows on slices 1, timeout 5 s>" in reply.text
    reply = kernel.run("r = host_rows(3); print(list(r), r[1].tolist())")
    assert reply.status == "ok", reply.error
    assert "[1] [1, 1, 1]" in reply.text
    assert "reading 3 rows on slice 1" in reply.text  # a sidecar's prints show in the calling cell
    reply = kernel.run("%pathways sidecar")
    assert "sidecar calls" in reply.text and "slice 1: 1 call," in reply.text


@pytest.mark.kernel
def test_errors_and_hangs_in_a_cell_are_one_line_and_the_kernel_stays_up(kernel):
    kernel.run(
        "%%pathways sidecar --timeout 2\n"
        "import time\n"
        "@pw.sidecar\n"
        "def broken(slice_index):\n"
        "    raise ValueError(f'bad record in shard {slice_index}')\n"
        "@pw.sidecar\n"
        "def frozen():\n"
        "    time.sleep(12)\n"
    )
    reply = kernel.run("broken()")
    assert reply.status == "error"
    assert reply.error.strip() == "SidecarError: sidecar 'broken' failed on slice 0: ValueError: bad record in shard 0"
    started = time.monotonic()
    reply = kernel.run("frozen()", timeout=30)
    assert reply.status == "error" and time.monotonic() - started < 20
    assert reply.error.strip().startswith("SidecarTimeout: sidecar 'frozen' on slice 0 did not finish within 2 s")
    assert kernel.run("print(1 + 1)").text.strip() == "2"


@pytest.mark.kernel
def test_notebook_feeds_a_training_loop_from_per_slice_loaders():
    text = "".join(outputs_text(cell) for cell in code_cells(execute("sidecar.ipynb")))
    assert "every sample exactly once: True" in text
    assert "committed steps saw every sample exactly once: True" in text
    assert "1 recovery, " in text and "1 scale-up, " in text
    assert "replay from step 10 on 1 shard" in text
    assert "batch sharded over slices [0, 1]" in text
    assert "sidecar calls" in text


@pytest.mark.serial  # timing: asserts each sidecar's busy seconds
@pytest.mark.kernel
def test_a_slice_lost_while_sidecars_run_keeps_the_live_slices_results(fresh_kernel):
    """Issue 22.4: a slice lost during `%%pathways sidecar --slices all` raised an 84-line
    DATA_LOSS, threw away slice 0's result, and slice 1's stats showed 0.00 s busy."""
    reply = fresh_kernel.run(
        "%%pathways sidecar --slices all\n"
        "import time\n"
        "import numpy as np\n"
        "@pw.sidecar\n"
        "def rows(slice_index):\n"
        "    time.sleep(2.0 if slice_index == 1 else 0.2)\n"
        "    return np.full(4, slice_index)\n"
    )
    assert reply.status == "ok", reply.error
    reply = fresh_kernel.run(
        "import threading\n"
        "threading.Timer(0.8, pw.fail_slice, (1,)).start()\n"
        "r = rows()\n"
        "print(sorted(r), r[0].tolist())"
    )
    assert reply.status == "ok", reply.error
    assert "[0] [0, 0, 0, 0]" in reply.text, reply.text
    said = [line for line in reply.error.splitlines() if line.strip()]
    assert len(said) == 1, reply.error
    assert "sidecar 'rows': slice 1 was lost while it ran (DATA_LOSS)" in said[0], said
    assert "slices [0]" in said[0], said
    table = fresh_kernel.run("%pathways sidecar").text
    slice1 = next(line for line in table.splitlines() if "slice 1:" in line)
    busy = float(slice1.split(" s busy")[0].rsplit(", ", 1)[-1])
    assert 1.5 <= busy < 3.0, table
    assert "1 error" in slice1, table
